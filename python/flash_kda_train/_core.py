"""The one place where torch tensors meet the C ABI: allocate outputs and workspace, then call.

No math here: every computation happens in libflash_kda_train.
"""

from __future__ import annotations

import ctypes
import dataclasses
from typing import NamedTuple, Optional

import torch

from . import _lib
from ._tensors import describe_torch, pointer


@dataclasses.dataclass(frozen=True)
class Config:
    """Resolved options of one chunk_kda call (scale already defaulted)."""

    scale: float
    lower_bound: Optional[float] = None
    chunk_size: int = 64
    use_qk_l2norm_in_kernel: bool = False
    use_gate_in_kernel: bool = False
    use_beta_sigmoid_in_kernel: bool = False
    allow_neg_eigval: bool = False
    safe_gate: bool = False
    disable_recompute: bool = False
    state_v_first: bool = False
    backend: str = "auto"

    def options(self) -> _lib.Options:
        if self.backend not in _lib.BACKENDS:
            raise ValueError(f"backend: expected one of {sorted(_lib.BACKENDS)}, got {self.backend!r}")
        return _lib.Options(
            scale=float(self.scale),
            lower_bound=float(self.lower_bound) if self.lower_bound is not None else 0.0,
            has_lower_bound=int(self.lower_bound is not None),
            chunk_size=int(self.chunk_size),
            use_qk_l2norm_in_kernel=int(self.use_qk_l2norm_in_kernel),
            use_gate_in_kernel=int(self.use_gate_in_kernel),
            use_beta_sigmoid_in_kernel=int(self.use_beta_sigmoid_in_kernel),
            allow_neg_eigval=int(self.allow_neg_eigval),
            safe_gate=int(self.safe_gate),
            disable_recompute=int(self.disable_recompute),
            state_v_first=int(self.state_v_first),
            backend=_lib.BACKENDS[self.backend],
        )


class Inputs(NamedTuple):
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    A_log: Optional[torch.Tensor] = None
    dt_bias: Optional[torch.Tensor] = None
    initial_state: Optional[torch.Tensor] = None
    cu_seqlens: Optional[torch.Tensor] = None
    cu_seqlens_cpu: Optional[torch.Tensor] = None


class Grads(NamedTuple):
    """Gradients of chunk_kda's differentiable inputs; None where the input is absent."""

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    dg: torch.Tensor
    dbeta: torch.Tensor
    dA_log: Optional[torch.Tensor]
    ddt_bias: Optional[torch.Tensor]
    dh0: Optional[torch.Tensor]


def _describe(t):
    return describe_torch(t) if t is not None else None


class _Call:
    """Described inputs and options of one library call; keeps every description alive."""

    def __init__(self, cfg: Config, inputs: Inputs):
        self.inputs = inputs
        self.options = cfg.options()
        self.described = {name: _describe(t) for name, t in inputs._asdict().items()}
        self.struct = _lib.Inputs(**{name: pointer(d) for name, d in self.described.items()})
        self.device = inputs.q.device

    def sizes(self) -> _lib.Sizes:
        sizes = _lib.Sizes()
        _lib.check(_lib.lib.fkt_plan_sizes(ctypes.byref(self.struct), ctypes.byref(self.options), ctypes.byref(sizes)))
        return sizes

    def buffer(self, nbytes: int):
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device) if nbytes else None

    def stream(self):
        if self.device.type == "cuda":
            return ctypes.c_void_p(torch.cuda.current_stream(self.device).cuda_stream)
        return None


def state_shape(cfg: Config, inputs: Inputs, num_sequences: int):
    K, HV, V = inputs.q.shape[-1], inputs.v.shape[2], inputs.v.shape[-1]
    return (num_sequences, HV, V, K) if cfg.state_v_first else (num_sequences, HV, K, V)


def forward(cfg: Config, inputs: Inputs, output_final_state: bool, return_intermediate_states: bool = False):
    """Runs the forward; returns (o, final_state or None, intermediate states or None)."""
    call = _Call(cfg, inputs)
    sizes = call.sizes()
    q, v = inputs.q, inputs.v
    state_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    o = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    final_state = (
        torch.empty(state_shape(cfg, inputs, sizes.num_sequences), dtype=state_dtype, device=q.device)
        if output_final_state
        else None
    )
    h = None
    if return_intermediate_states:
        K, HV, V = q.shape[-1], v.shape[2], v.shape[-1]
        tail = (HV, V, K) if cfg.state_v_first else (HV, K, V)
        h = torch.empty((q.shape[0], sizes.num_chunks, *tail), dtype=q.dtype, device=q.device)
    workspace = call.buffer(sizes.forward_workspace_bytes)
    saved = call.buffer(sizes.saved_bytes)
    outs = {name: _describe(t) for name, t in
            dict(o=o, final_state=final_state, intermediate_states=h, saved=saved, workspace=workspace).items()}
    struct = _lib.ForwardOutputs(**{name: pointer(d) for name, d in outs.items()})
    _lib.check(_lib.lib.fkt_forward(ctypes.byref(call.struct), ctypes.byref(call.options), ctypes.byref(struct),
                                    call.stream()))
    return o, final_state, h


def _like(t, dtype=None):
    return torch.empty(t.shape, dtype=dtype or t.dtype, device=t.device) if t is not None else None


def backward(cfg: Config, inputs: Inputs, d_o: torch.Tensor, d_final_state: Optional[torch.Tensor]) -> Grads:
    """Runs the backward; returns every gradient of the differentiable inputs."""
    call = _Call(cfg, inputs)
    sizes = call.sizes()
    grads = Grads(
        dq=_like(inputs.q),
        dk=_like(inputs.k),
        dv=_like(inputs.v),
        dg=_like(inputs.g),
        dbeta=_like(inputs.beta),
        dA_log=_like(inputs.A_log) if cfg.use_gate_in_kernel else None,
        ddt_bias=_like(inputs.dt_bias) if cfg.use_gate_in_kernel else None,
        dh0=_like(inputs.initial_state),
    )
    _call_backward(call, sizes.backward_workspace_bytes, d_o, d_final_state, grads, _lib.lib.fkt_backward)
    return grads


def _call_backward(call, workspace_bytes, d_o, d_final_state, grads, fn, gold=False):
    workspace = call.buffer(workspace_bytes)
    tensors = dict(d_o=d_o, d_final_state=d_final_state, saved=None, **grads._asdict(), workspace=workspace)
    described = {name: _describe(t) for name, t in tensors.items()}
    struct = _lib.BackwardIO(**{name: pointer(d) for name, d in described.items()})
    if gold:
        _lib.check(fn(ctypes.byref(call.struct), ctypes.byref(call.options), ctypes.byref(struct)))
    else:
        _lib.check(fn(ctypes.byref(call.struct), ctypes.byref(call.options), ctypes.byref(struct), call.stream()))


def gold_forward(cfg: Config, inputs: Inputs, output_final_state: bool = True):
    """The fp64 token-by-token recurrence on the CPU: (o, final_state) in float64."""
    call = _Call(cfg, inputs)
    sizes = call.sizes()
    o = torch.empty(inputs.v.shape, dtype=torch.float64)
    final_state = (
        torch.empty(state_shape(cfg, inputs, sizes.num_sequences), dtype=torch.float64) if output_final_state else None
    )
    do, dht = _describe(o), _describe(final_state)
    _lib.check(_lib.lib.fkt_gold_forward(ctypes.byref(call.struct), ctypes.byref(call.options), do.ref(),
                                         pointer(dht)))
    return o, final_state


def gold_backward(cfg: Config, inputs: Inputs, d_o: torch.Tensor, d_final_state: Optional[torch.Tensor]) -> Grads:
    """Exact fp64 gradients of the token-by-token recurrence on the CPU."""
    call = _Call(cfg, inputs)
    f64 = torch.float64
    grads = Grads(
        dq=_like(inputs.q, f64),
        dk=_like(inputs.k, f64),
        dv=_like(inputs.v, f64),
        dg=_like(inputs.g, f64),
        dbeta=_like(inputs.beta, f64),
        dA_log=_like(inputs.A_log, f64) if cfg.use_gate_in_kernel else None,
        ddt_bias=_like(inputs.dt_bias, f64) if cfg.use_gate_in_kernel else None,
        dh0=_like(inputs.initial_state, f64),
    )
    _call_backward(call, 0, d_o, d_final_state, grads, _lib.lib.fkt_gold_backward, gold=True)
    return grads
