"""The fp64 gold oracle: FLA's chunk_kda semantics computed token by token in float64 on the CPU
(libflash_kda_train's gold recurrence with its exact backward)."""

from __future__ import annotations

from typing import Optional

import torch

from . import _core
from .api import _resolve


def _cpu(t):
    return t.detach().cpu() if t is not None else None


def gold(q, k, v, g, beta, do=None, dht=None, scale=None, initial_state=None, output_final_state=True,
         use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
         allow_neg_eigval=False, safe_gate=False, lower_bound=None, state_v_first=False, cu_seqlens=None,
         **kwargs):
    """Returns ``(o, final_state, grads)`` in float64; ``grads`` is None unless ``do`` is given.

    Inputs may live on any device and have any supported dtype: the gold reads the same (rounded)
    values the op reads.
    """
    cfg, A_log, dt_bias, _ = _resolve(
        q, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
        use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound, False, state_v_first,
        _cpu(cu_seqlens), None, None, {**kwargs, "backend": "cpu"})
    inputs = _core.Inputs(*(_cpu(t) for t in (q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens)))
    o, final_state = _core.gold_forward(cfg, inputs, output_final_state)
    grads: Optional[_core.Grads] = None
    if do is not None:
        grads = _core.gold_backward(cfg, inputs, _cpu(do), _cpu(dht))
    return o, final_state, grads
