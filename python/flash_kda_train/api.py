"""The public API: chunk_kda with FLA's exact signature, and the explicit forward/backward pair."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Optional

import torch

from . import _core
from . import ops as _ops  # noqa: F401  (registers the custom ops)

_KNOWN_KWARGS = {"A_log", "dt_bias", "chunk_size", "transpose_state_layout", "backend"}


def _resolve(q, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
             use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound, disable_recompute, state_v_first,
             cu_seqlens, cu_seqlens_cpu, cp_context, kwargs):
    """FLA's argument handling (kda-math.md section 1.3) up to what the library validates itself."""
    unknown = set(kwargs) - _KNOWN_KWARGS
    if unknown:
        raise TypeError(f"chunk_kda: unexpected keyword arguments {sorted(unknown)}; accepted extra keywords are "
                        f"{sorted(_KNOWN_KWARGS)}")
    if "transpose_state_layout" in kwargs:
        if state_v_first:
            raise ValueError("transpose_state_layout: deprecated alias of state_v_first; pass only state_v_first")
        warnings.warn("transpose_state_layout is deprecated; use state_v_first", DeprecationWarning, stacklevel=3)
        state_v_first = bool(kwargs["transpose_state_layout"])
    if cp_context is not None:
        raise NotImplementedError("cp_context: context parallelism is not supported by flash_kda_train yet")
    A_log = kwargs.get("A_log") if use_gate_in_kernel else None
    dt_bias = kwargs.get("dt_bias") if use_gate_in_kernel else None
    if scale is None:
        scale = q.shape[-1] ** -0.5
    cfg = _core.Config(scale=float(scale), lower_bound=lower_bound, chunk_size=int(kwargs.get("chunk_size", 64)),
                       use_qk_l2norm_in_kernel=bool(use_qk_l2norm_in_kernel),
                       use_gate_in_kernel=bool(use_gate_in_kernel),
                       use_beta_sigmoid_in_kernel=bool(use_beta_sigmoid_in_kernel),
                       allow_neg_eigval=bool(allow_neg_eigval), safe_gate=bool(safe_gate),
                       disable_recompute=bool(disable_recompute), state_v_first=bool(state_v_first),
                       backend=kwargs.get("backend", "auto"))
    if cu_seqlens is not None and cu_seqlens_cpu is None and cu_seqlens.device.type != "cpu":
        cu_seqlens_cpu = cu_seqlens.cpu()  # planning reads offsets on the host
    return cfg, A_log, dt_bias, cu_seqlens_cpu


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
              allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
              return_intermediate_states=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
              cp_context=None, **kwargs):
    """Drop-in for FLA's ``chunk_kda``: same arguments, defaults and return values.

    Returns ``(o, final_state)`` (``final_state`` is None unless ``output_final_state``), or
    ``(o, final_state, h)`` with ``return_intermediate_states`` (inference mode only). Extra
    keywords: ``A_log``, ``dt_bias``, ``chunk_size`` (32 or 64), ``transpose_state_layout``
    (deprecated alias of ``state_v_first``) and ``backend`` ("auto", "cpu" or "cuda").
    """
    cfg, A_log, dt_bias, cu_seqlens_cpu = _resolve(
        q, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
        use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound, disable_recompute, state_v_first,
        cu_seqlens, cu_seqlens_cpu, cp_context, kwargs)
    if return_intermediate_states:
        if not torch.is_inference_mode_enabled():
            raise ValueError("return_intermediate_states: only available under torch.inference_mode()")
        if disable_recompute:
            raise ValueError("return_intermediate_states: cannot be combined with disable_recompute=True")
        inputs = _core.Inputs(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu)
        return _core.forward(cfg, inputs, output_final_state, return_intermediate_states=True)
    flags = [cfg.use_qk_l2norm_in_kernel, cfg.use_gate_in_kernel, cfg.use_beta_sigmoid_in_kernel,
             cfg.allow_neg_eigval, cfg.safe_gate, cfg.disable_recompute, cfg.state_v_first]
    o, final_state = torch.ops.flash_kda_train.chunk_kda_fwd(
        q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu, cfg.scale, cfg.lower_bound,
        cfg.chunk_size, flags, bool(output_final_state), cfg.backend)
    return o, (final_state if output_final_state else None)


@dataclasses.dataclass
class Context:
    """What ``backward`` needs from ``forward``: the inputs (by reference) and the options."""

    config: _core.Config
    inputs: _core.Inputs
    output_final_state: bool


def forward(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
            use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
            allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False, state_v_first=False,
            cu_seqlens=None, cu_seqlens_cpu=None, **kwargs):
    """The explicit forward for callers that manage their own autograd.

    Same arguments as ``chunk_kda``. Returns ``(o, final_state, context)``; pass the context to
    ``backward``. No autograd graph is recorded.
    """
    cfg, A_log, dt_bias, cu_seqlens_cpu = _resolve(
        q, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
        use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound, disable_recompute, state_v_first,
        cu_seqlens, cu_seqlens_cpu, None, kwargs)
    with torch.no_grad():
        inputs = _core.Inputs(*(t.detach() if t is not None else None for t in (
            q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu)))
        o, final_state, _ = _core.forward(cfg, inputs, output_final_state)
    return o, final_state, Context(cfg, inputs, bool(output_final_state))


def backward(context: Context, do: torch.Tensor, dht: Optional[torch.Tensor] = None) -> _core.Grads:
    """Gradients of ``forward``'s inputs given ``do`` (and ``dht`` for the final state, or None).

    Returns a ``Grads`` named tuple: dq, dk, dv, dg, dbeta, dA_log, ddt_bias, dh0 (None where the
    input is absent).
    """
    with torch.no_grad():
        return _core.backward(context.config, context.inputs, do.detach(),
                              dht.detach() if dht is not None else None)
