"""The PyTorch adapter of the C ABI calls: torch tensors are described in place, outputs and
workspace are allocated with torch on the inputs' device, CUDA work goes on the current stream.

The procedures themselves (plan, allocate, call) are framework-free, in ``_abi``. No math here:
every computation happens in libflash_kda_train.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.utils.dlpack import to_dlpack

from . import _abi
from ._abi import Config, ForwardResult, Grads, Inputs  # noqa: F401  (re-exported: the torch layer's names)


_DTYPE_NAMES = {}  # torch.dtype -> its name without "torch."


class _Torch(_abi.Framework):
    to_dlpack = staticmethod(to_dlpack)

    def not_exported(self, t, error: Exception) -> str:
        if not isinstance(t, torch.Tensor):
            return f"expected a torch.Tensor, got {type(t).__name__}"
        if t.device.type not in ("cpu", "cuda"):
            return f"expected a CPU or CUDA tensor, got one on {t.device}"
        return f"torch cannot export it through DLPack ({type(error).__name__}: {error})"

    def shape(self, t):
        return tuple(t.shape)

    def dtype(self, t) -> str:
        name = _DTYPE_NAMES.get(t.dtype)
        if name is None:
            name = _DTYPE_NAMES[t.dtype] = str(t.dtype).replace("torch.", "")
        return name

    # The quickest torch calls for these on the host (torch.empty with a device takes 1.5 to 3 times as long).
    def empty(self, shape, dtype: str, like):
        return like.new_empty(shape, dtype=getattr(torch, dtype))

    def empty_like(self, t, dtype=None):
        return torch.empty_like(t, dtype=getattr(torch, dtype) if dtype else None,
                                memory_format=torch.contiguous_format)

    def stream(self, like):
        # The raw handle, as Triton reads it: torch.cuda.current_stream builds a Stream object (a few
        # microseconds before every launch).
        return torch._C._cuda_getCurrentRawStream(like.get_device()) if like.is_cuda else None

    def on_host(self, t) -> bool:
        return t.device.type == "cpu"

    def to_host(self, t):
        return t.cpu()


TORCH = _Torch()


def state_dtype(q: torch.Tensor) -> torch.dtype:
    return getattr(torch, _abi.state_dtype(TORCH, q))


def state_shape(cfg: Config, inputs: Inputs, num_sequences: int):
    return _abi.state_shape(TORCH, cfg, inputs, num_sequences)


def _readable(t):
    """The CPU backend reads any strides; CUDA kernels read dense rows, so strided CUDA inputs
    (views from a fused projection, say) are made contiguous, as FLA does with every input."""
    return t.contiguous() if t is not None and t.is_cuda else t


def readable(inputs: Inputs) -> Inputs:
    """``inputs`` as the backend of their device reads them."""
    return Inputs(*(_readable(t) for t in inputs))


def forward(cfg: Config, inputs: Inputs, output_final_state: bool, return_intermediate_states: bool = False,
            for_backward: bool = True) -> ForwardResult:
    """Runs the forward; ``saved`` of the result goes to ``backward`` (see ``_abi.ForwardResult``);
    ``for_backward=False`` when none follows (``_abi.forward``)."""
    return _abi.forward(TORCH, cfg, readable(inputs), output_final_state, return_intermediate_states, for_backward)


def backward(cfg: Config, inputs: Inputs, d_o: torch.Tensor, d_final_state: Optional[torch.Tensor],
             saved: Optional[torch.Tensor] = None) -> Grads:
    """Runs the backward; returns every gradient of the differentiable inputs. ``saved``: what the
    forward kept for it (``forward(...).saved``: a ``disable_recompute`` workspace, or T, P and the
    time segments' states), else None."""
    return _abi.backward(TORCH, cfg, readable(inputs), _readable(d_o), _readable(d_final_state), saved)


def gold_forward(cfg: Config, inputs: Inputs, output_final_state: bool = True):
    """The fp64 token-by-token recurrence on the CPU: (o, final_state) in float64."""
    return _abi.gold_forward(TORCH, cfg, inputs, output_final_state)


def gold_backward(cfg: Config, inputs: Inputs, d_o: torch.Tensor, d_final_state: Optional[torch.Tensor]) -> Grads:
    """Exact fp64 gradients of the token-by-token recurrence on the CPU."""
    return _abi.gold_backward(TORCH, cfg, inputs, d_o, d_final_state)
