"""Framework-free calls into the C ABI: options, plan, output allocation and the call itself.

Each framework adapter (``_core`` for PyTorch, ``paddle`` for PaddlePaddle) supplies a
``Framework``: how to export one of its tensors through DLPack, read its shape and dtype,
allocate an empty tensor next to another one, and find the stream to launch on. No math here and
no framework import: every computation happens in libflash_kda_train.
"""

from __future__ import annotations

import ctypes
import dataclasses
import numbers
import warnings
from typing import Any, NamedTuple, Optional, Sequence

from . import _lib
from ._tensors import Block


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
    # fkt_options.forward_pieces (c_api.h): the planner's choice (docs/design.md, "The forward in
    # pieces").
    forward_pieces: int = -1

    def options(self) -> _lib.Options:
        """The C ABI's options (read-only there: one struct per Config, built on first use)."""
        options = self.__dict__.get("_options")
        if options is None:
            options = self._build_options()
            object.__setattr__(self, "_options", options)  # frozen: not a field, a cache
        return options

    def _build_options(self) -> _lib.Options:
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
            forward_pieces=int(self.forward_pieces),
        )


class Inputs(NamedTuple):
    """The tensors of one call (framework tensors; None where absent)."""

    q: Any
    k: Any
    v: Any
    g: Any
    beta: Any
    A_log: Any = None
    dt_bias: Any = None
    initial_state: Any = None
    cu_seqlens: Any = None
    cu_seqlens_cpu: Any = None


class ForwardResult(NamedTuple):
    """What the forward returns. ``saved`` is what the backward reads: the workspace, instead of
    recomputing (``disable_recompute`` on the CUDA backend), or what the forward kept for a
    recomputing backward (``fkt_sizes.saved_bytes``, CUDA: the states entering its time segments, the
    chunks' T and P), else None."""

    o: Any
    final_state: Optional[Any]
    intermediate_states: Optional[Any]
    saved: Optional[Any]


class Grads(NamedTuple):
    """Gradients of chunk_kda's differentiable inputs; None where the input is absent."""

    dq: Any
    dk: Any
    dv: Any
    dg: Any
    dbeta: Any
    dA_log: Optional[Any]
    ddt_bias: Optional[Any]
    dh0: Optional[Any]


class Framework:
    """What the calls below need from a tensor framework (subclassed by each adapter)."""

    def to_dlpack(self, t):
        """A DLPack capsule of tensor ``t`` (an unversioned, unconsumed DLManagedTensor named
        "dltensor"), sharing its memory; may raise anything for a tensor it cannot export."""
        raise NotImplementedError

    def not_exported(self, t, error: Exception) -> str:
        """Why ``to_dlpack(t)`` raised ``error``, said to a caller who passed ``t``."""
        raise NotImplementedError

    def data_ptr(self, t) -> int:
        return t.data_ptr()

    def shape(self, t) -> Sequence[int]:
        raise NotImplementedError

    def dtype(self, t) -> str:
        """The dtype's name: "bfloat16", "float16", "float32", "float64", "int32", "int64", ..."""
        raise NotImplementedError

    def empty(self, shape, dtype: str, like):
        """An uninitialised tensor of ``shape`` and ``dtype`` on ``like``'s device."""
        raise NotImplementedError

    def empty_like(self, t, dtype: Optional[str] = None):
        """An uninitialised contiguous tensor of ``t``'s shape and device, of ``dtype`` (``t``'s
        by default)."""
        return self.empty(tuple(self.shape(t)), dtype or self.dtype(t), t)

    def stream(self, like):
        """The stream to launch on for ``like``'s device (its address: an int or a ctypes.c_void_p),
        or None on the CPU."""
        raise NotImplementedError

    def on_host(self, t) -> bool:
        """Whether ``t`` lives in host memory."""
        raise NotImplementedError

    def to_host(self, t):
        """A copy of ``t`` in host memory."""
        raise NotImplementedError


def check_unmodified(inputs: Inputs, versions_before: tuple, versions_now: tuple) -> None:
    """The paired backward's guard: each input's in-place version counter as at the forward (None
    where a framework keeps none), since the context keeps the inputs by reference."""
    for name, before, now in zip(inputs._fields, versions_before, versions_now):
        if before != now:
            raise RuntimeError(f"backward: {name} was modified in place after forward (version {before} -> {now}); "
                               f"the context keeps the inputs by reference, so the gradients would be those of "
                               f"other inputs")


def host_offsets(fw: Framework, cu_seqlens, cu_seqlens_cpu):
    """``cu_seqlens_cpu`` as the planner reads it: the one given, else a host copy of device offsets
    (one device-to-host copy), else None (cu_seqlens itself lives on the host)."""
    if cu_seqlens is None and cu_seqlens_cpu is not None:
        raise ValueError("cu_seqlens_cpu: given without cu_seqlens (it is the host copy of cu_seqlens; FLA ignores "
                         "it then, which would silently run the batch as dense sequences)")
    if cu_seqlens is None or cu_seqlens_cpu is not None or fw.on_host(cu_seqlens):
        return cu_seqlens_cpu
    return fw.to_host(cu_seqlens)


def describe_all(fw: Framework, names: Sequence[str], tensors: Sequence[Any]) -> Block:
    """The tensors (None where absent) described in one block, in the order of ``names``; a tensor
    that cannot be described raises a ValueError naming its argument."""
    to_dlpack = fw.to_dlpack
    try:
        return Block([None if t is None else to_dlpack(t) for t in tensors])
    except Exception:  # a framework's exporter raises BufferError, RuntimeError, TypeError, ...
        for name, t in zip(names, tensors):
            try:
                if t is not None:
                    to_dlpack(t)
            except Exception as e:
                raise ValueError(f"{name}: {fw.not_exported(t, e)}") from None
        raise


class Call:
    """Described inputs and options of one library call (``described.address`` is its fkt_inputs)."""

    def __init__(self, fw: Framework, cfg: Config, inputs: Inputs):
        self.fw = fw
        self.inputs = inputs
        self.options = cfg.options()
        self.described = describe_all(fw, _lib.INPUT_NAMES, inputs)
        self._sizes = None

    def sizes(self) -> _lib.Sizes:
        if self._sizes is None:
            sizes = _lib.Sizes()
            _lib.check(_lib.lib.fkt_plan_sizes(self.described.address, ctypes.byref(self.options),
                                               ctypes.byref(sizes)))
            self._sizes = sizes
        return self._sizes

    def buffer(self, nbytes: int):
        return self.fw.empty((nbytes,), "uint8", self.inputs.q) if nbytes else None

    def stream(self):
        return self.fw.stream(self.inputs.q)


def state_dtype(fw: Framework, q) -> str:
    """The recurrent state's dtype for inputs like q: float64 for float64 inputs, else float32."""
    return "float64" if fw.dtype(q) == "float64" else "float32"


def state_shape(fw: Framework, cfg: Config, inputs: Inputs, num_sequences: int):
    K, HV, V = fw.shape(inputs.q)[-1], fw.shape(inputs.v)[2], fw.shape(inputs.v)[-1]
    return (num_sequences, HV, V, K) if cfg.state_v_first else (num_sequences, HV, K, V)


def forward(fw: Framework, cfg: Config, inputs: Inputs, output_final_state: bool,
            return_intermediate_states: bool = False, for_backward: bool = True) -> ForwardResult:
    """Runs the forward (final and intermediate states only when asked). ``for_backward=False``: no
    backward follows, so nothing is allocated for one to read (``saved`` is None, but for
    ``disable_recompute``'s kept workspace, which the forward runs in anyway)."""
    call = Call(fw, cfg, inputs)
    sizes = call.sizes()
    q, v = inputs.q, inputs.v
    q_dtype = fw.dtype(q)
    o = fw.empty_like(v, q_dtype)
    final_state = (
        fw.empty(state_shape(fw, cfg, inputs, sizes.num_sequences), state_dtype(fw, q), q)
        if output_final_state
        else None
    )
    h = None
    if return_intermediate_states:
        K, HV, V = fw.shape(q)[-1], fw.shape(v)[2], fw.shape(v)[-1]
        tail = (HV, V, K) if cfg.state_v_first else (HV, K, V)
        h = fw.empty((fw.shape(q)[0], sizes.num_chunks, *tail), q_dtype, q)
    saved = call.buffer(sizes.saved_bytes) if for_backward else None
    # With `saved` the CUDA forward forms P there, where it would otherwise need room in the workspace.
    workspace_bytes = sizes.forward_workspace_bytes if saved is None else sizes.saving_forward_workspace_bytes
    workspace = call.buffer(workspace_bytes)
    outs = describe_all(fw, _lib.FORWARD_OUTPUT_NAMES, (o, final_state, h, workspace, saved))
    _lib.check(_lib.lib.fkt_forward(call.described.address, ctypes.byref(call.options), outs.address, call.stream()))
    if not sizes.backward_reads_forward_workspace:
        return ForwardResult(o, final_state, h, saved)
    _USED_WORKSPACES.discard(fw.data_ptr(workspace))
    return ForwardResult(o, final_state, h, workspace)


def _like(fw: Framework, t, dtype: Optional[str] = None):
    return fw.empty_like(t, dtype) if t is not None else None


def _grads(fw: Framework, cfg: Config, inputs: Inputs, dtype: Optional[str] = None) -> Grads:
    return Grads(
        dq=_like(fw, inputs.q, dtype),
        dk=_like(fw, inputs.k, dtype),
        dv=_like(fw, inputs.v, dtype),
        dg=_like(fw, inputs.g, dtype),
        dbeta=_like(fw, inputs.beta, dtype),
        dA_log=_like(fw, inputs.A_log, dtype) if cfg.use_gate_in_kernel else None,
        ddt_bias=_like(fw, inputs.dt_bias, dtype) if cfg.use_gate_in_kernel else None,
        dh0=_like(fw, inputs.initial_state, dtype),
    )


# Addresses of the kept forward workspaces that a backward has run on. The backward writes some of
# its gradients over intermediates it has read (docs/design.md, "What backward needs from forward"),
# so a second backward on the same workspace would be wrong: it is refused. A forward that keeps a
# workspace clears its address, since a freed workspace's memory may come back to a later one.
_USED_WORKSPACES = set()

WORKSPACE_USED = ("disable_recompute=True: a backward already ran on this forward's kept workspace and wrote "
                  "gradients over its intermediates; run one backward per forward, or use disable_recompute=False "
                  "to run several (for example with retain_graph=True)")


def backward(fw: Framework, cfg: Config, inputs: Inputs, d_o, d_final_state, saved=None) -> Grads:
    """Runs the backward; returns every gradient of the differentiable inputs. ``saved`` is the
    forward's ``ForwardResult.saved`` (a kept workspace serves one backward)."""
    call = Call(fw, cfg, inputs)
    sizes = call.sizes()
    if sizes.backward_reads_forward_workspace:
        if saved is None:
            raise ValueError("disable_recompute: the CUDA backward reads the forward's intermediates; pass the "
                             "forward's saved workspace (ForwardResult.saved)")
        address = fw.data_ptr(saved)
        if address in _USED_WORKSPACES:
            raise RuntimeError(WORKSPACE_USED)
        workspace, kept = saved, None
    else:
        if sizes.saved_bytes and saved is None:
            raise ValueError("saved: the CUDA backward reads what its forward kept for it (the chunks' T and P, the "
                             "states entering its time segments); pass the forward's saved buffer "
                             "(ForwardResult.saved)")
        workspace, kept = call.buffer(sizes.backward_workspace_bytes), saved
    grads = _grads(fw, cfg, inputs)
    _call_backward(call, workspace, d_o, d_final_state, grads, _lib.lib.fkt_backward, kept=kept)
    if sizes.backward_reads_forward_workspace:
        _USED_WORKSPACES.add(address)
    return grads


def _call_backward(call: Call, workspace, d_o, d_final_state, grads, fn, gold=False, kept=None):
    io = describe_all(call.fw, _lib.BACKWARD_IO_NAMES, (d_o, d_final_state, *grads, workspace, kept))
    if gold:
        _lib.check(fn(call.described.address, ctypes.byref(call.options), io.address))
    else:
        _lib.check(fn(call.described.address, ctypes.byref(call.options), io.address, call.stream()))


def gold_forward(fw: Framework, cfg: Config, inputs: Inputs, output_final_state: bool = True):
    """The fp64 token-by-token recurrence on the CPU: (o, final_state) in float64 (CPU inputs)."""
    call = Call(fw, cfg, inputs)
    sizes = call.sizes()
    o = fw.empty(tuple(fw.shape(inputs.v)), "float64", inputs.q)
    final_state = (
        fw.empty(state_shape(fw, cfg, inputs, sizes.num_sequences), "float64", inputs.q)
        if output_final_state else None
    )
    outs = describe_all(fw, ("o", "final_state"), (o, final_state))
    _lib.check(_lib.lib.fkt_gold_forward(call.described.address, ctypes.byref(call.options), outs.tensor(0),
                                         outs.tensor(1)))
    return o, final_state


def gold_backward(fw: Framework, cfg: Config, inputs: Inputs, d_o, d_final_state) -> Grads:
    """Exact fp64 gradients of the token-by-token recurrence on the CPU (CPU inputs)."""
    call = Call(fw, cfg, inputs)
    grads = _grads(fw, cfg, inputs, "float64")
    _call_backward(call, None, d_o, d_final_state, grads, _lib.lib.fkt_gold_backward, gold=True)
    return grads


KNOWN_KWARGS = frozenset({"A_log", "dt_bias", "chunk_size", "transpose_state_layout", "backend", "forward_pieces"})
# resolve's Configs by their arguments (and chunk_size's type, which it checks): a call with the
# options of an earlier one takes its Config, and with it the C options built once (Config.options).
# Only for arguments of plain types (None, bool, int, float, str): a tensor's value may change.
_RESOLVED = {}
_MAX_RESOLVED = 256
_PLAIN = frozenset((type(None), bool, int, float, str))


def resolve(head_dim: int, scale, use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
            allow_neg_eigval, safe_gate, lower_bound, disable_recompute, state_v_first, kwargs: dict,
            caller: str = "chunk_kda"):
    """FLA's handling of chunk_kda's options and extra keywords (kda-math.md section 1.3, the
    parts the library does not validate itself), for adapters without torch.

    Returns ``(config, A_log, dt_bias)``: ``A_log``/``dt_bias`` are None unless the gate is
    applied in the kernel (FLA ignores them otherwise).
    """
    unknown = set(kwargs) - KNOWN_KWARGS
    if unknown:
        raise TypeError(f"{caller}: unexpected keyword arguments {sorted(unknown)}; accepted extra keywords are "
                        f"{sorted(KNOWN_KWARGS)}")
    if "transpose_state_layout" in kwargs:
        if state_v_first:
            raise ValueError("transpose_state_layout: deprecated alias of state_v_first; pass only state_v_first")
        warnings.warn("transpose_state_layout is deprecated; use state_v_first", DeprecationWarning, stacklevel=4)
        state_v_first = bool(kwargs["transpose_state_layout"])
    chunk_size = kwargs.get("chunk_size", 64)
    backend = kwargs.get("backend", "auto")
    forward_pieces = kwargs.get("forward_pieces", Config.forward_pieces)
    args = (head_dim, scale, use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
            allow_neg_eigval, safe_gate, lower_bound, disable_recompute, state_v_first, chunk_size, backend,
            forward_pieces)
    key = (args, type(chunk_size), type(forward_pieces)) if _PLAIN.issuperset(map(type, args)) else None
    cfg = _RESOLVED.get(key) if key is not None else None
    if cfg is None:
        cfg = _config(*args)
        if key is not None and len(_RESOLVED) < _MAX_RESOLVED:
            _RESOLVED[key] = cfg
    A_log = kwargs.get("A_log") if use_gate_in_kernel else None
    dt_bias = kwargs.get("dt_bias") if use_gate_in_kernel else None
    return cfg, A_log, dt_bias


def _int32(value) -> bool:
    """Whether value fits the library's 32-bit integer options (a bool does not count)."""
    return not isinstance(value, bool) and isinstance(value, numbers.Integral) and -2**31 <= value < 2**31


def _config(head_dim: int, scale, use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
            allow_neg_eigval, safe_gate, lower_bound, disable_recompute, state_v_first, chunk_size, backend,
            forward_pieces) -> Config:
    """resolve's Config of these arguments, chunk_size's and forward_pieces' types checked (their values
    by the library)."""
    if not _int32(chunk_size):
        raise ValueError(f"chunk_size: expected an integer (32 or 64), got {chunk_size!r}")
    if not _int32(forward_pieces):
        raise ValueError(f"forward_pieces: expected an integer (-1, 0, 1 or a count of pieces), got {forward_pieces!r}")
    default_scale = head_dim ** -0.5 if head_dim >= 1 else 1.0  # K = 0 is refused by the library
    return Config(scale=float(scale if scale is not None else default_scale), lower_bound=lower_bound,
                  chunk_size=int(chunk_size),
                  use_qk_l2norm_in_kernel=bool(use_qk_l2norm_in_kernel), use_gate_in_kernel=bool(use_gate_in_kernel),
                  use_beta_sigmoid_in_kernel=bool(use_beta_sigmoid_in_kernel), allow_neg_eigval=bool(allow_neg_eigval),
                  safe_gate=bool(safe_gate), disable_recompute=bool(disable_recompute),
                  state_v_first=bool(state_v_first), backend=backend, forward_pieces=int(forward_pieces))
