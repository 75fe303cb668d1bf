"""The public API: chunk_kda with FLA's exact signature, and the explicit forward/backward pair."""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from . import _abi, _core
from . import segments as _segments
from . import ops as _ops  # noqa: F401  (registers the custom ops)


def _resolve(q, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
             use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound, disable_recompute, state_v_first,
             cu_seqlens, cu_seqlens_cpu, cp_context, kwargs):
    """FLA's argument handling (kda-math.md section 1.3) up to what the library validates itself."""
    if cp_context is not None:  # FLA's rules (AssertionErrors there); the context's offsets replace cu_seqlens
        if initial_state is not None:
            raise ValueError("initial_state: must be None with cp_context (context parallelism builds the state "
                             "entering each rank's first sequence from the earlier ranks)")
        if output_final_state:
            raise ValueError("output_final_state: must be False with cp_context (the final state of a sequence "
                             "cut across ranks is not returned)")
        if getattr(cp_context, "cu_seqlens", None) is None:
            raise ValueError("cp_context: its cu_seqlens (the rank-local offsets) must be set; build the context "
                             "with flash_kda_train.cp.build_cp_context(cu_seqlens, group)")
    cfg, A_log, dt_bias = _abi.resolve(q.shape[-1], scale, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                                       use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound,
                                       disable_recompute, state_v_first, kwargs)
    return cfg, A_log, dt_bias, _abi.host_offsets(_core.TORCH, cu_seqlens, cu_seqlens_cpu)


# The extra keywords chunk_kda accepts: the library's options, and segment_size, which it serves here.
EXTRA_KWARGS = _abi.KNOWN_KWARGS | {"segment_size"}


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
              allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
              return_intermediate_states=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
              cp_context=None, use_graph=False, max_num_seqs=None, **kwargs):
    """Drop-in for FLA's ``chunk_kda``: same arguments, defaults and return values.

    The op allocates only through torch and never synchronises, so a CUDA graph can capture it,
    provided the host offsets ``cu_seqlens_cpu`` come with a CUDA ``cu_seqlens`` (otherwise planning
    copies the offsets to the host once per call); a replay computes the offsets of the capture.
    ``use_graph`` (FLA 0.6's graph mode, whose replays take new offsets in the same ``cu_seqlens``)
    is therefore refused with ``cu_seqlens`` and needs nothing without; ``max_num_seqs`` goes with it.

    Returns ``(o, final_state)`` (``final_state`` is None unless ``output_final_state``), or
    ``(o, final_state, h)`` with ``return_intermediate_states`` (inference mode only). Extra
    keywords: ``A_log``, ``dt_bias``, ``chunk_size`` (32 or 64), ``transpose_state_layout``
    (deprecated alias of ``state_v_first``), ``backend`` ("auto", "cpu" or "cuda"),
    ``forward_pieces`` and ``segment_size``.

    ``forward_pieces`` (-1 by default: the planner's choice; 0 or 1: the whole call at once; up to 16)
    runs the CUDA forward of dense bfloat16 inputs with K = V = 128 and chunk_size 64 (without
    disable_recompute) in that many pieces of its chunks, the state pass of a piece on a second
    stream beside the chunk kernel of the next: the same bits, less time where the sequences x
    heads are few. Where they are fewer still, the planner's choice may run the pieces side by side
    from the states of an exact scan over their summaries (results within fp32 rounding of the
    whole call's). docs/design.md, "The forward in pieces". Other calls and backends run whole.

    ``segment_size`` (tokens, a multiple of the chunk size) runs the op on consecutive segments of
    the tokens (of every batch row, or of the packed sequences), a sequence cut by a segment
    boundary continuing in the next segment from the state it left (exact: cuts fall on chunk
    boundaries, so the chunks and the fp32 state are those of one call), so the CUDA workspace,
    which grows with the tokens of a call, is that of one segment; autograd runs the segments'
    backwards in turn.
    It trades a little time (more launches, a concatenation of o and of the gradients) for memory;
    with B > 1 the segments of the inputs are copied (the op reads contiguous tensors), and with
    ``disable_recompute`` each segment keeps its workspace for the backward, as one call would.

    ``cp_context`` (from ``flash_kda_train.cp.build_cp_context`` or FLA's, either layout) runs
    context-parallel over a torch.distributed group: the inputs are this rank's tokens of the packed
    batch (one slice, or two parts with ``layout="zigzag"``), the result is ``(o, None)`` for them
    (see ``flash_kda_train.cp``).
    """
    if use_graph and (cu_seqlens is not None or cp_context is not None):
        raise ValueError("use_graph: not supported with cu_seqlens or cp_context (FLA's graph mode replays one graph "
                         "with new offsets; this op sizes its kernels from each call's offsets, so a replay would "
                         "compute the captured ones): call with use_graph=False, capturing one graph per offsets if "
                         "needed")
    segment_size = kwargs.pop("segment_size", None)
    cfg, A_log, dt_bias, cu_seqlens_cpu = _resolve(
        q, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
        use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound, disable_recompute, state_v_first,
        cu_seqlens, cu_seqlens_cpu, cp_context, kwargs)
    if segment_size is not None:
        _check_segment_size(segment_size, cfg, cp_context, return_intermediate_states)
        offsets = None
        if cu_seqlens is not None:
            host = cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens
            readable = host.dim() == 1 and host.dtype in (torch.int32, torch.int64)
            offsets = [int(o) for o in host.tolist()] if readable else None
        if _segments.applies(q, segment_size, cu_seqlens, offsets, initial_state):
            def op(q_s, k_s, v_s, g_s, beta_s, state, seg_cu, seg_host):
                return _op(cfg, q_s, k_s, v_s, g_s, beta_s, A_log, dt_bias, state, seg_cu, seg_host, True)
            return _segments.run(op, segment_size, cfg.chunk_size, q, k, v, g, beta, initial_state,
                                 output_final_state, cu_seqlens, offsets)
    if cp_context is not None:
        if return_intermediate_states:
            raise ValueError("return_intermediate_states: not available with cp_context")
        from . import cp as _cp

        return _cp.chunk_kda(cfg, q, k, v, g, beta, A_log, dt_bias, cp_context), None
    if return_intermediate_states:
        if not torch.is_inference_mode_enabled():
            raise ValueError("return_intermediate_states: only available under torch.inference_mode()")
        if disable_recompute:
            raise ValueError("return_intermediate_states: cannot be combined with disable_recompute=True")
        inputs = _core.Inputs(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu)
        o, final_state, h, _ = _core.forward(cfg, inputs, output_final_state, return_intermediate_states=True,
                                             for_backward=False)
        return o, final_state, h
    return _op(cfg, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu, output_final_state)


def fused_recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None,
                        output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                        use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None,
                        state_v_first=False, cu_seqlens=None, **kwargs):
    """Drop-in for FLA's ``fused_recurrent_kda`` (the token-by-token form that FLA's KDA layer calls
    for short inputs at inference): the same arguments, defaults and ``(o, final_state)``, computed
    by ``chunk_kda``, which runs the same recurrence in chunks (any length, a single token
    included), with gradients where FLA's has none. The extra keywords are ``chunk_kda``'s. FLA's
    per-value-column beta (``[B, T, HV, V]``, one beta per element of v) is refused: the delta rule
    of ``chunk_kda`` takes one beta per token and value head.
    """
    if beta.dim() == v.dim():
        raise ValueError(f"beta: expected [B, T, HV] (one beta per token and value head), got "
                         f"{list(beta.shape)}; a beta per value column is not supported")
    return chunk_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                     use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel,
                     use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
                     lower_bound=lower_bound, state_v_first=state_v_first, cu_seqlens=cu_seqlens, A_log=A_log,
                     dt_bias=dt_bias, **kwargs)


def _op(cfg, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu, output_final_state):
    tensors = (q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu)
    if torch.compiler.is_compiling():  # the custom op, so the graph holds it without a break
        flags = [cfg.use_qk_l2norm_in_kernel, cfg.use_gate_in_kernel, cfg.use_beta_sigmoid_in_kernel,
                 cfg.allow_neg_eigval, cfg.safe_gate, cfg.disable_recompute, cfg.state_v_first]
        o, final_state, _ = torch.ops.flash_kda_train.chunk_kda_fwd(
            *tensors, cfg.scale, cfg.lower_bound, cfg.chunk_size, flags, bool(output_final_state), cfg.backend,
            cfg.forward_pieces)
    elif torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors[:8]):
        o, final_state = _ops.EagerChunkKda.apply(*tensors, cfg, bool(output_final_state))
    else:  # no gradient to take: no autograd node, and nothing saved for a backward
        o, final_state, _, _ = _core.forward(cfg, _core.Inputs(*tensors), output_final_state, for_backward=False)
    return o, (final_state if output_final_state else None)


def _check_segment_size(segment_size, cfg, cp_context, return_intermediate_states):
    if isinstance(segment_size, bool) or not isinstance(segment_size, int) or segment_size <= 0 or \
            segment_size % cfg.chunk_size:
        raise ValueError(f"segment_size: expected a positive multiple of the chunk size {cfg.chunk_size} "
                         f"(tokens), got {segment_size!r}")
    if cp_context is not None:
        raise ValueError("segment_size: not with cp_context (each rank already holds a slice of the tokens)")
    if return_intermediate_states:
        raise ValueError("segment_size: not with return_intermediate_states")


@dataclasses.dataclass
class Context:
    """What ``backward`` needs from ``forward``: the inputs (by reference), the options, and the
    forward's workspace when the backward reads it (``disable_recompute`` on CUDA)."""

    config: _core.Config
    inputs: _core.Inputs
    output_final_state: bool
    saved: Optional[torch.Tensor]
    versions: tuple  # each input's version counter at the forward (None for absent inputs)


def forward(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
            use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
            allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False, state_v_first=False,
            cu_seqlens=None, cu_seqlens_cpu=None, **kwargs):
    """The explicit forward for callers that manage their own autograd.

    Same arguments as ``chunk_kda`` except ``return_intermediate_states``, ``cp_context``,
    ``use_graph`` and ``max_num_seqs``. Returns ``(o, final_state, context)``; pass the context to
    ``backward``. No autograd graph is recorded.
    """
    cfg, A_log, dt_bias, cu_seqlens_cpu = _resolve(
        q, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
        use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound, disable_recompute, state_v_first,
        cu_seqlens, cu_seqlens_cpu, None, kwargs)
    with torch.no_grad():
        inputs = _core.Inputs(*(t.detach() if t is not None else None for t in (
            q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu)))
        o, final_state, _, saved = _core.forward(cfg, inputs, output_final_state)
    return o, final_state, Context(cfg, inputs, bool(output_final_state), saved, _versions(inputs))


def _versions(inputs: _core.Inputs) -> tuple:
    """Version counters of the inputs (None for absent ones and inference tensors, which have none)."""
    return tuple(t._version if t is not None and not t.is_inference() else None for t in inputs)


def backward(context: Context, do: torch.Tensor, dht: Optional[torch.Tensor] = None) -> _core.Grads:
    """Gradients of ``forward``'s inputs given ``do`` (and ``dht`` for the final state, or None).

    Returns a ``Grads`` named tuple: dq, dk, dv, dg, dbeta, dA_log, ddt_bias, dh0 (None where the
    input is absent).
    """
    if dht is not None and not context.output_final_state:
        raise ValueError("dht: given, but the forward ran with output_final_state=False (no final state to "
                         "differentiate)")
    _abi.check_unmodified(context.inputs, context.versions, _versions(context.inputs))
    with torch.no_grad():
        return _core.backward(context.config, context.inputs, do.detach(),
                              dht.detach() if dht is not None else None, context.saved)
