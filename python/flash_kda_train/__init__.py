"""flash_kda_train: KDA (Kimi Delta Attention) forward and backward for training.

``chunk_kda`` is a drop-in for FLA's ``chunk_kda``; ``forward``/``backward`` are the explicit pair;
``reference`` holds the fp64 token-by-token gold oracle.
"""

from . import reference
from ._core import Config, Grads
from ._lib import has_cuda, version
from .api import Context, backward, chunk_kda, forward

__version__ = version()
__all__ = ["chunk_kda", "forward", "backward", "Context", "Config", "Grads", "reference", "has_cuda", "version"]
