"""flash_kda_train: KDA (Kimi Delta Attention) forward and backward for training.

``chunk_kda`` is a drop-in for FLA's ``chunk_kda`` (``fused_recurrent_kda`` for FLA's function of
that name); ``forward``/``backward`` are the explicit pair; ``reference`` holds the fp64
token-by-token gold oracle. ``flash_kda_train.nn`` has the ``KimiDeltaAttention`` layer,
``flash_kda_train.paddle`` the PaddlePaddle ``chunk_kda``.

The PyTorch parts are imported only when torch is installed, so that the Paddle adapter
(``import flash_kda_train.paddle``) works without torch.
"""

from ._lib import has_cuda, version

__version__ = version()
__all__ = ["has_cuda", "version"]

try:
    import torch as _torch  # noqa: F401
except ModuleNotFoundError as missing:  # no torch: the framework-free core and the Paddle adapter only
    if missing.name != "torch":
        raise
else:
    from . import reference
    from ._core import Config, Grads
    from .api import Context, backward, chunk_kda, forward, fused_recurrent_kda

    __all__ += ["chunk_kda", "fused_recurrent_kda", "forward", "backward", "Context", "Config", "Grads", "reference"]
