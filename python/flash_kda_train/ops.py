"""torch.library custom ops with registered autograd and fake (meta) implementations, so that
torch.compile traces chunk_kda without a graph break; in eager mode chunk_kda runs the same forward
and backward as a torch.autograd.Function (EagerChunkKda)."""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _core

_NAMESPACE = "flash_kda_train"


def _config(scale, lower_bound, chunk_size, flags: List[bool], backend: str, forward_pieces: int) -> _core.Config:
    l2norm, gate, beta_sigmoid, neg_eigval, safe_gate, disable_recompute, state_v_first = flags
    return _core.Config(scale=scale, lower_bound=lower_bound, chunk_size=chunk_size, use_qk_l2norm_in_kernel=l2norm,
                        use_gate_in_kernel=gate, use_beta_sigmoid_in_kernel=beta_sigmoid,
                        allow_neg_eigval=neg_eigval, safe_gate=safe_gate, disable_recompute=disable_recompute,
                        state_v_first=state_v_first, backend=backend, forward_pieces=forward_pieces)


def _absent(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None or t.numel() == 0 and t.dim() == 1 else t


def _empty(like: Tensor) -> Tensor:
    """Stands in for an absent output: custom ops return tensors, never None."""
    return like.new_empty(0)


def _saved_or_empty(saved: Optional[Tensor], q: Tensor) -> Tensor:
    return saved if saved is not None else q.new_empty(0, dtype=torch.uint8)


def _final_state_or_empty(final_state: Optional[Tensor], q: Tensor) -> Tensor:
    return final_state if final_state is not None else q.new_empty(0, dtype=_core.state_dtype(q))


def _aligned(nbytes: int) -> int:
    """Where the library's next carved array starts (core/carver.hpp: 64-byte alignment)."""
    return -(-nbytes // 64) * 64


def _saved_bytes(q: Tensor, v: Tensor, cu_seqlens: Optional[Tensor], chunk_size: int, backend: str) -> int:
    """fkt_sizes.saved_bytes of a recomputing call, for the fake (cuda/sm90/saved.hpp): on CUDA the fp32
    states entering all but the first of the time segments of dense inputs (cuda/sm90/segments.hpp,
    time_segments: up to three of at least eight chunks), then T and P, [B*T, HV, chunk] each: T fp32,
    P in the products' operand type (bf16 for bfloat16 q, else fp32). test_cuda_backward checks it
    against the library's."""
    if backend == "cpu" or q.device.type != "cuda":
        return 0
    B, T, HV = q.shape[0], q.shape[1], v.shape[2]
    states = 0
    chunks = -(-T // chunk_size)
    count = min(3, chunks // 8)
    if cu_seqlens is None and count >= 2:
        count = -(-chunks // -(-chunks // count))  # ranges of ceil(chunks / count) chunks
        states = (count - 1) * B * HV * q.shape[-1] * v.shape[-1] * 4
    p_bytes = 2 if q.dtype == torch.bfloat16 else 4
    return _aligned(states) + _aligned(B * T * HV * chunk_size * 4) + _aligned(B * T * HV * chunk_size * p_bytes)


def _forward(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, A_log: Optional[Tensor],
             dt_bias: Optional[Tensor], initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor],
             cu_seqlens_cpu: Optional[Tensor], scale: float, lower_bound: Optional[float], chunk_size: int,
             flags: List[bool], output_final_state: bool, backend: str,
             forward_pieces: int) -> Tuple[Tensor, Tensor, Tensor]:
    """(o, final state or empty, what the backward reads or empty: the workspace with disable_recompute
    on CUDA, else what the forward saved for it). The body of the custom op chunk_kda_fwd."""
    cfg = _config(scale, lower_bound, chunk_size, flags, backend, forward_pieces)
    inputs = _core.Inputs(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu)
    o, final_state, _, saved = _core.forward(cfg, inputs, output_final_state)
    return o, _final_state_or_empty(final_state, q), _saved_or_empty(saved, q)


chunk_kda_fwd = torch.library.custom_op(f"{_NAMESPACE}::chunk_kda_fwd", _forward, mutates_args=())


@chunk_kda_fwd.register_fake
def _(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu, scale, lower_bound, chunk_size,
      flags, output_final_state, backend, forward_pieces):
    state_dtype = _core.state_dtype(q)
    # The kept workspace's size depends on the offsets' values (chunks per sequence): data-dependent.
    saved_bytes = torch.library.get_ctx().new_dynamic_size() if flags[5] else _saved_bytes(
        q, v, cu_seqlens, chunk_size, backend)
    saved = q.new_empty(saved_bytes, dtype=torch.uint8)
    o = v.new_empty(v.shape, dtype=q.dtype)
    if not output_final_state:
        return o, q.new_empty(0, dtype=state_dtype), saved
    num_sequences = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else q.shape[0]
    K, HV, V = q.shape[-1], v.shape[2], v.shape[-1]
    state_v_first = flags[6]
    shape = (num_sequences, HV, V, K) if state_v_first else (num_sequences, HV, K, V)
    return o, q.new_empty(shape, dtype=state_dtype), saved


def _backward_op(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, A_log: Optional[Tensor],
                 dt_bias: Optional[Tensor], initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor],
                 cu_seqlens_cpu: Optional[Tensor], d_o: Tensor, d_final_state: Optional[Tensor], saved: Tensor,
                 scale: float, lower_bound: Optional[float], chunk_size: int, flags: List[bool],
                 backend: str, forward_pieces: int) -> List[Tensor]:
    """Every gradient (empty for absent inputs): the body of the custom op chunk_kda_bwd."""
    cfg = _config(scale, lower_bound, chunk_size, flags, backend, forward_pieces)
    inputs = _core.Inputs(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu)
    grads = _core.backward(cfg, inputs, d_o, _absent(d_final_state), saved if saved.numel() else None)
    return [t if t is not None else _empty(q) for t in grads]


chunk_kda_bwd = torch.library.custom_op(f"{_NAMESPACE}::chunk_kda_bwd", _backward_op, mutates_args=())


@chunk_kda_bwd.register_fake
def _(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu, d_o, d_final_state, saved, scale,
      lower_bound, chunk_size, flags, backend, forward_pieces):
    gate_in_kernel = flags[1]
    optional = [A_log if gate_in_kernel else None, dt_bias if gate_in_kernel else None, initial_state]
    # Contiguous, as the library allocates its gradients, whatever the inputs' strides.
    return [t.new_empty(t.shape) for t in (q, k, v, g, beta)] + [
        t.new_empty(t.shape) if t is not None else _empty(q) for t in optional
    ]


_INPUTS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "cu_seqlens", "cu_seqlens_cpu")
_OPTIONS = ("scale", "lower_bound", "chunk_size", "flags", "backend", "forward_pieces")


def _setup_context(ctx, inputs, output):
    named = dict(zip(_INPUTS + ("scale", "lower_bound", "chunk_size", "flags", "output_final_state", "backend",
                                "forward_pieces"), inputs))
    ctx.save_for_backward(*(named[name] for name in _INPUTS), output[2])
    ctx.options = {name: named[name] for name in _OPTIONS}


def _gradients(ctx, d_o, d_final_state, backward_op):
    *inputs, saved = ctx.saved_tensors
    grads = backward_op(*inputs, d_o, _absent(d_final_state), saved, **ctx.options)
    dA_log, ddt_bias, dh0 = (_absent(t) for t in grads[5:])
    # One gradient per op input: q, k, v, g, beta, A_log, dt_bias, initial_state, then None for
    # cu_seqlens, cu_seqlens_cpu and the seven options.
    return (*grads[:5], dA_log, ddt_bias, dh0) + (None,) * 9


def _backward(ctx, d_o, d_final_state, _d_saved):
    return _gradients(ctx, d_o, d_final_state, torch.ops.flash_kda_train.chunk_kda_bwd)


chunk_kda_fwd.register_autograd(_backward, setup_context=_setup_context)


class EagerChunkKda(torch.autograd.Function):
    """chunk_kda_fwd with its autograd, outside torch.compile: the same forward, saved tensors and
    backward as the custom op, without the op's per-call dispatch (torch re-reads the 17-argument
    schema to fill defaults before setup_context: about 85 us per forward call on a 2-core VM, about
    as much as the rest of the call's Python). Takes chunk_kda_fwd's ten tensor arguments, then the
    resolved ``_core.Config`` and output_final_state (fewer arguments for ``apply`` to unwrap, no
    Config rebuilt from the op's flags); returns (o, final state or empty)."""

    @staticmethod
    def forward(ctx, *args):
        inputs, cfg, output_final_state = _core.Inputs(*args[:10]), args[10], args[11]
        o, final_state, _, saved = _core.forward(cfg, inputs, output_final_state=output_final_state)
        ctx.save_for_backward(*inputs, saved)
        ctx.cfg = cfg
        return o, _final_state_or_empty(final_state, inputs.q)

    @staticmethod
    @torch.autograd.function.once_differentiable  # no second-order terms: create_graph then raises
    def backward(ctx, d_o, d_final_state):
        *inputs, saved = ctx.saved_tensors
        grads = _core.backward(ctx.cfg, _core.Inputs(*inputs), d_o, _absent(d_final_state), saved)
        # One gradient per argument: q, k, v, g, beta, A_log, dt_bias, initial_state, then None for
        # cu_seqlens, cu_seqlens_cpu, the Config and output_final_state.
        return tuple(grads) + (None,) * 4
