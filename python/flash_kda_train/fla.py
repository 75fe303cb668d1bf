"""Plugs flash_kda_train into FLA: ``import flash_kda_train.fla`` registers a backend for
``fla.ops.kda.chunk_kda`` in FLA's dispatch registry (FLA >= 0.6, ``fla.backends``).

Calls the backend accepts run our kernels with our autograd; the others (said once per reason in
the log of ``flash_kda_train.fla``) fall through to FLA's own Triton kernels. The backend accepts
exactly what our CUDA backend supports. ``FLA_FLASH_KDA_TRAIN=0`` switches it off.
"""

from __future__ import annotations

import logging

import torch
from fla.backends import BaseBackend, register
from fla.ops.kda.chunk import chunk_kda as _fla_chunk_kda

from . import api, has_cuda

logger = logging.getLogger(__name__)
_declined: set = set()

_MAX_HEAD_DIM = 128  # the CUDA backend's limits (src/cuda/sm90/forward/launch.cu)
_MAX_VALUE_HEADS = 65535
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _reason(q, k, v, g, beta, cu_seqlens, cp_context, use_graph, kwargs):
    """Why our CUDA backend cannot take the call, or None."""
    if not has_cuda():
        return "this flash_kda_train build has no CUDA backend"
    if not q.is_cuda:
        return f"tensors on {q.device}, the backend runs on CUDA"
    if torch.cuda.get_device_capability(q.device) != (9, 0):
        return f"compute capability {torch.cuda.get_device_capability(q.device)} (built for Hopper, sm_90a)"
    if cp_context is not None:
        return "context parallelism is not routed through FLA's dispatch (flash_kda_train.chunk_kda takes cp_context)"
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if t.dtype not in _DTYPES:
            return f"{name} dtype {t.dtype} (supported: bfloat16, float16, float32)"
    if q.shape[-1] > _MAX_HEAD_DIM or v.shape[-1] > _MAX_HEAD_DIM:
        return f"head dims K = {q.shape[-1]}, V = {v.shape[-1]} (supported: <= {_MAX_HEAD_DIM})"
    if v.shape[2] > _MAX_VALUE_HEADS:
        return f"{v.shape[2]} value heads (supported: <= {_MAX_VALUE_HEADS})"
    if use_graph and cu_seqlens is not None:
        return "use_graph with cu_seqlens (FLA's graph mode replays new offsets; ours would compute the captured ones)"
    unknown = sorted(set(kwargs) - api.EXTRA_KWARGS)
    if unknown:
        return f"keyword arguments {unknown} (FLA ignores them; flash_kda_train refuses them)"
    return None


@register(_fla_chunk_kda)
class FlashKDATrainBackend(BaseBackend):
    """flash_kda_train's forward and backward for FLA's chunk_kda (training and inference)."""

    backend_type = "flash_kda_train"
    package_name = "flash_kda_train"
    env_var = "FLA_FLASH_KDA_TRAIN"
    default_enable = True
    priority = 4  # after FlashKDA (3), which keeps the bf16 inference calls it accepts

    def chunk_kda_verifier(self, q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                           allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
                           return_intermediate_states=False, state_v_first=False, cu_seqlens=None,
                           cu_seqlens_cpu=None, cp_context=None, use_graph=False, max_num_seqs=None, **kwargs):
        reason = _reason(q, k, v, g, beta, cu_seqlens, cp_context, use_graph, kwargs)
        if reason is not None and reason not in _declined:
            _declined.add(reason)
            logger.info("flash_kda_train declines chunk_kda: %s", reason)
        return reason is None, reason

    def chunk_kda(self, q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                  use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                  allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
                  return_intermediate_states=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
                  cp_context=None, use_graph=False, max_num_seqs=None, **kwargs):
        return api.chunk_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                             output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                             use_gate_in_kernel=use_gate_in_kernel,
                             use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
                             safe_gate=safe_gate, lower_bound=lower_bound, disable_recompute=disable_recompute,
                             return_intermediate_states=return_intermediate_states, state_v_first=state_v_first,
                             cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, cp_context=cp_context,
                             use_graph=use_graph, max_num_seqs=max_num_seqs, **kwargs)
