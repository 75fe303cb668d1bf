"""PaddlePaddle adapter: ``chunk_kda`` as a ``paddle.autograd.PyLayer`` over the same C ABI.

    import paddle
    from flash_kda_train.paddle import chunk_kda

    o, final_state = chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                               use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
    (o.astype("float32").square().sum() + final_state.sum()).backward()

Same signature, defaults, return values and gradients as ``flash_kda_train.chunk_kda`` (FLA's
``chunk_kda``). Needs paddle only, not torch. Paddle tensors are described to the library in
place (Paddle's DLPack export); non-contiguous inputs are made contiguous first.
``return_intermediate_states`` is served with gradients disabled (``paddle.no_grad()``), Paddle's
counterpart of ``torch.inference_mode()``. Not supported: ``cp_context``.
"""

from __future__ import annotations

import ctypes

import paddle
from paddle.autograd import PyLayer
from paddle.utils.dlpack import to_dlpack as _to_dlpack

from . import _abi

__all__ = ["chunk_kda", "forward", "backward"]


class _Paddle(_abi.Framework):
    @staticmethod
    def to_dlpack(t):
        # A view may sit at an offset into its allocation: only contiguous tensors, which the
        # adapter's callers make, are exported.
        if not t.is_contiguous():
            raise ValueError("expected a contiguous paddle tensor (call .contiguous() first)")
        return _to_dlpack(t)

    def not_exported(self, t, error: Exception) -> str:
        if isinstance(error, ValueError):
            return str(error)
        if not isinstance(t, paddle.Tensor):
            return f"expected a paddle.Tensor, got {type(t).__name__}"
        if not (t.place.is_cpu_place() or t.place.is_gpu_place()):
            return f"expected a CPU or GPU paddle tensor, got one on {t.place}"
        return f"paddle cannot export it through DLPack ({type(error).__name__}: {error})"

    def shape(self, t):
        return tuple(int(n) for n in t.shape)

    def dtype(self, t) -> str:
        return str(t.dtype).replace("paddle.", "")

    def empty(self, shape, dtype: str, like):
        return paddle.empty(list(shape), dtype=dtype, device=like.place)

    def stream(self, like):
        place = like.place
        if place.is_gpu_place():
            stream = paddle.device.current_stream(paddle.CUDAPlace(place.gpu_device_id()))
            return ctypes.c_void_p(int(getattr(stream, "stream_base", stream).cuda_stream))
        return None

    def on_host(self, t) -> bool:
        return t.place.is_cpu_place()

    def to_host(self, t):
        return t.cpu()


PADDLE = _Paddle()

_TENSOR_INPUTS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "cu_seqlens", "cu_seqlens_cpu")


def _contiguous(t):
    return t if t is None or t.is_contiguous() else t.contiguous()


class _ChunkKDA(PyLayer):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu, cfg,
                output_final_state):
        inputs = _abi.Inputs(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu)
        o, final_state, _, saved = _abi.forward(PADDLE, cfg, inputs, output_final_state)
        ctx.save_for_backward(*inputs)
        ctx.saved = saved  # the forward's workspace when the backward reads it (disable_recompute on CUDA)
        # Paddle wants None (not a tensor) for every input that does not require a gradient.
        ctx.wants_grad = [t is not None and not t.stop_gradient for t in inputs]
        ctx.cfg = cfg
        ctx.output_final_state = output_final_state
        return o, final_state

    @staticmethod
    def backward(ctx, *grad_outputs):
        # One gradient per tensor output: d_o, then d_final_state when the final state was returned
        # (Paddle passes zeros for an output that was not used).
        inputs = _abi.Inputs(*ctx.saved_tensor())
        d_o = grad_outputs[0]
        if d_o is None:
            d_o = paddle.zeros_like(inputs.v, dtype=inputs.q.dtype)
        d_final_state = grad_outputs[1] if ctx.output_final_state and len(grad_outputs) > 1 else None
        grads = _abi.backward(PADDLE, ctx.cfg, inputs, _contiguous(d_o), _contiguous(d_final_state), ctx.saved)
        by_input = dict(q=grads.dq, k=grads.dk, v=grads.dv, g=grads.dg, beta=grads.dbeta, A_log=grads.dA_log,
                        dt_bias=grads.ddt_bias, initial_state=grads.dh0)
        # PyLayer wants one gradient (or None) per tensor input, absent inputs skipped.
        return tuple(by_input.get(name) if wants else None
                     for name, t, wants in zip(_TENSOR_INPUTS, inputs, ctx.wants_grad) if t is not None)


def _prepare(q, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
             use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound, disable_recompute, state_v_first,
             cu_seqlens, cu_seqlens_cpu, cp_context, kwargs):
    if cp_context is not None:
        raise NotImplementedError("cp_context: context parallelism is not supported by flash_kda_train.paddle")
    cfg, A_log, dt_bias = _abi.resolve(
        int(q.shape[-1]), scale, use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
        allow_neg_eigval, safe_gate, lower_bound, disable_recompute, state_v_first, kwargs)
    return cfg, A_log, dt_bias, _abi.host_offsets(PADDLE, cu_seqlens, cu_seqlens_cpu)


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
              allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
              return_intermediate_states=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
              cp_context=None, **kwargs):
    """FLA's ``chunk_kda`` for paddle tensors: same arguments, defaults and return values.

    Returns ``(o, final_state)`` (``final_state`` is None unless ``output_final_state``), or
    ``(o, final_state, h)`` with ``return_intermediate_states`` (under ``paddle.no_grad()`` only).
    Extra keywords: ``A_log``, ``dt_bias``, ``chunk_size`` (32 or 64), ``transpose_state_layout``
    (deprecated alias of ``state_v_first``), ``backend`` ("auto", "cpu" or "cuda") and
    ``forward_pieces`` (as flash_kda_train.chunk_kda's).
    """
    cfg, A_log, dt_bias, cu_seqlens_cpu = _prepare(
        q, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
        use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound, disable_recompute, state_v_first,
        cu_seqlens, cu_seqlens_cpu, cp_context, kwargs)
    tensors = [_contiguous(t) for t in (q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens,
                                        cu_seqlens_cpu)]
    if return_intermediate_states:
        if paddle.is_grad_enabled():
            raise ValueError("return_intermediate_states: only available with gradients disabled (paddle.no_grad())")
        if disable_recompute:
            raise ValueError("return_intermediate_states: cannot be combined with disable_recompute=True")
        o, final_state, h, _ = _abi.forward(PADDLE, cfg, _abi.Inputs(*tensors), output_final_state,
                                            return_intermediate_states=True, for_backward=False)
        return o, final_state, h
    if not (paddle.is_grad_enabled() and any(t is not None and not t.stop_gradient for t in tensors[:8])):
        # No gradient to take: no PyLayer node, and nothing saved for a backward.
        o, final_state, _, _ = _abi.forward(PADDLE, cfg, _abi.Inputs(*tensors), output_final_state,
                                            for_backward=False)
        return o, final_state
    o, final_state = _ChunkKDA.apply(*tensors, cfg, bool(output_final_state))
    return o, (final_state if output_final_state else None)


def forward(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
            use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
            allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False, state_v_first=False,
            cu_seqlens=None, cu_seqlens_cpu=None, **kwargs):
    """The explicit forward for callers that manage their own autograd (no graph is recorded).

    Returns ``(o, final_state, context)``; pass the context to ``backward``.
    """
    cfg, A_log, dt_bias, cu_seqlens_cpu = _prepare(
        q, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
        use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound, disable_recompute, state_v_first,
        cu_seqlens, cu_seqlens_cpu, None, kwargs)
    with paddle.no_grad():
        inputs = _abi.Inputs(*(_contiguous(t.detach()) if t is not None else None for t in (
            q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu)))
        o, final_state, _, saved = _abi.forward(PADDLE, cfg, inputs, output_final_state)
    return o, final_state, (cfg, inputs, saved, _versions(inputs))


def _versions(inputs: _abi.Inputs) -> tuple:
    """In-place version counters of the inputs (None for absent ones); a detached tensor shares its
    source's, as in PyTorch."""
    return tuple(t._inplace_version() if t is not None else None for t in inputs)


def backward(context, do, dht=None) -> _abi.Grads:
    """Gradients of ``forward``'s inputs given ``do`` (and ``dht`` for the final state, or None):
    a ``Grads`` named tuple (dq, dk, dv, dg, dbeta, dA_log, ddt_bias, dh0; None where absent).
    Raises RuntimeError when an input was modified in place since ``forward``."""
    cfg, inputs, saved, versions = context
    _abi.check_unmodified(inputs, versions, _versions(inputs))
    with paddle.no_grad():
        return _abi.backward(PADDLE, cfg, inputs, _contiguous(do.detach()),
                             _contiguous(dht.detach()) if dht is not None else None, saved)
