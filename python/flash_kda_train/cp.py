"""Context parallelism for ``chunk_kda`` over torch.distributed (kda-math.md section 9).

Each rank of a process group holds a contiguous ``T / world`` slice of the packed ``B = 1`` token
stream; sequences may start and end anywhere, so a rank's first local sequence may continue from
earlier ranks and its last local sequence may continue on later ranks. The state recurrence is
affine over a slice, so the ranks exchange one small summary per direction:

* forward: every rank whose last local sequence continues later summarises that sequence as
  ``S_out = M S_in + S_ext`` (``[HV, K, V + K] = [S_ext | M]``); ONE all-gather; a rank whose first
  local sequence started earlier folds its predecessors' summaries in order into that sequence's
  initial state; then the ordinary forward runs.
* backward: every rank whose first local sequence started earlier summarises the state gradient
  ``dS_in = dM dS_out + dS_ext`` of that sequence (``dS_ext`` holds its ``d_o`` terms); ONE
  all-gather; a rank whose last local sequence continues later folds its successors' summaries
  from the farthest to the nearest into that sequence's final-state gradient; then the ordinary
  backward runs. No ``dh0`` is returned.

Every rank returns exactly what the single-device op returns for its slice, with gradients. The
parameter gradients (``dA_log``, ``ddt_bias``) of a rank are the contributions of its own tokens;
sum them over the group (as data-parallel training does for any parameter) for the full gradient.

Usage::

    ctx = build_cp_context(cu_seqlens_global, group)        # once per batch layout
    o, _ = chunk_kda(q_local, k_local, v_local, g_local, beta_local, cp_context=ctx, ...)

The summaries and the fold are computed by libflash_kda_train on the tensors' device (the CPU
backend with a Gloo group, the CUDA backend with an NCCL group, on the current stream); the
exchange uses torch.distributed collectives only.
"""

from __future__ import annotations

import ctypes
import dataclasses
from typing import Optional

import torch
import torch.distributed as dist

from . import _abi, _core, _lib


@dataclasses.dataclass
class CPContext:
    """What one rank needs to run ``chunk_kda`` on its slice (the fields of FLA's ``FLACPContext``).

    ``cu_seqlens`` are the rank-local offsets (global boundaries clipped to the slice, shifted to
    start at 0); ``pre_num_ranks`` is how many earlier ranks the first local sequence continues from
    (0: it starts on this rank), ``post_num_ranks`` how many later ranks the last local sequence
    continues on (0: it ends on this rank). ``group`` is the process group (None: the default group).
    """

    group: Optional[dist.ProcessGroup] = None
    cu_seqlens: Optional[torch.Tensor] = None
    cu_seqlens_cpu: Optional[torch.Tensor] = None
    pre_num_ranks: int = 0
    post_num_ranks: int = 0

    @property
    def is_first_rank(self) -> bool:
        """True when the first local sequence starts on this rank."""
        return self.pre_num_ranks == 0

    @property
    def is_last_rank(self) -> bool:
        """True when the last local sequence ends on this rank."""
        return self.post_num_ranks == 0

    @property
    def num_seqs(self) -> int:
        return 0 if self.cu_seqlens is None else len(self.cu_seqlens) - 1

    def copy_for_backward(self) -> "CPContext":
        return dataclasses.replace(
            self,
            cu_seqlens=self.cu_seqlens.clone() if self.cu_seqlens is not None else None,
            cu_seqlens_cpu=self.cu_seqlens_cpu.clone() if self.cu_seqlens_cpu is not None else None,
        )


def build_cp_context(cu_seqlens: torch.Tensor, group: Optional[dist.ProcessGroup] = None,
                     cu_seqlens_cpu: Optional[torch.Tensor] = None, *, rank: Optional[int] = None,
                     world_size: Optional[int] = None) -> CPContext:
    """The context of this rank from the GLOBAL ``cu_seqlens`` of the packed batch.

    The ``T`` tokens are split into ``world_size`` contiguous slices of ``T / world_size`` tokens
    (``T`` must be divisible); rank ``r`` holds tokens ``[r T / world, (r + 1) T / world)``. Empty
    sequences are dropped (they have no tokens on any rank). ``rank`` and ``world_size`` default to
    those of ``group`` (torch.distributed must then be initialised); pass them to build the context
    of any rank without a process group.
    """
    if world_size is None or rank is None:
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("build_cp_context: torch.distributed is not initialised; pass rank and world_size, or "
                             "initialise the process group first")
        world_size = dist.get_world_size(group) if world_size is None else world_size
        rank = dist.get_rank(group) if rank is None else rank
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size: expected a positive integer, got {world_size!r}")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
        raise ValueError(f"rank: expected an integer in [0, {world_size}), got {rank!r}")
    host = cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens.detach().cpu()
    if host.dim() != 1 or host.numel() < 2 or host.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"cu_seqlens: expected a 1-D int32/int64 tensor [N + 1] with N >= 1, got "
                         f"{host.dtype} of shape {list(host.shape)}")
    offsets = [int(x) for x in host.tolist()]
    if offsets[0] != 0 or any(b < a for a, b in zip(offsets, offsets[1:])):
        raise ValueError(f"cu_seqlens: expected non-decreasing offsets starting at 0, got {offsets}")
    total = offsets[-1]
    if total == 0 or total % world_size:
        raise ValueError(f"cu_seqlens: context parallelism splits the T = {total} packed tokens into world_size = "
                         f"{world_size} equal slices; T must be a positive multiple of world_size")
    part = total // world_size
    start, end = rank * part, (rank + 1) * part
    # The non-empty global sequences overlapping [start, end), in order; they tile the slice.
    spans = [(a, b) for a, b in zip(offsets, offsets[1:]) if b > a and a < end and b > start]
    local = [0] + [min(b, end) - start for _, b in spans]
    local_cpu = torch.tensor(local, dtype=torch.int64)
    return CPContext(
        group=group,
        cu_seqlens=local_cpu.to(cu_seqlens.device),
        cu_seqlens_cpu=local_cpu,
        pre_num_ranks=rank - spans[0][0] // part,
        post_num_ranks=(spans[-1][1] - 1) // part - rank,
    )


# ---------------------------------------------------------------------------------------------------
# The library calls (summaries and fold), with workspace sized by fkt_cp_plan_sizes.

def _call(cfg: _core.Config, inputs: _core.Inputs) -> _abi.Call:
    """The described inputs of one summary call, as the backend reads them (contiguous on CUDA)."""
    return _abi.Call(_core.TORCH, cfg, _core.readable(inputs))


def _cp_sizes(call: _abi.Call) -> _lib.CpSizes:
    sizes = _lib.CpSizes()
    _lib.check(_lib.lib.fkt_cp_plan_sizes(call.described.address, ctypes.byref(call.options), ctypes.byref(sizes)))
    return sizes


def _empty_summary(inputs: _core.Inputs) -> torch.Tensor:
    K, HV, V = inputs.q.shape[-1], inputs.v.shape[2], inputs.v.shape[-1]
    return torch.zeros((HV, K, V + K), dtype=_core.state_dtype(inputs.q), device=inputs.q.device)


def forward_summary(cfg: _core.Config, inputs: _core.Inputs, sequence: int) -> torch.Tensor:
    """``[S_ext | M]`` ([HV, K, V + K], state dtype) of sequence ``sequence`` of the inputs."""
    call = _call(cfg, inputs)
    return _forward_summary(call, _cp_sizes(call), sequence)


def _forward_summary(call: _abi.Call, sizes: _lib.CpSizes, sequence: int) -> torch.Tensor:
    """forward_summary of a call already planned (sizes)."""
    out = _empty_summary(call.inputs)
    workspace = call.buffer(sizes.forward_summary_workspace_bytes)
    d = _abi.describe_all(_core.TORCH, ("out", "workspace"), (out, workspace))
    _lib.check(_lib.lib.fkt_cp_forward_summary(call.described.address, ctypes.byref(call.options), sequence,
                                               d.tensor(0), d.tensor(1), call.stream()))
    return out


def backward_summary(cfg: _core.Config, inputs: _core.Inputs, d_o: torch.Tensor, sequence: int) -> torch.Tensor:
    """``[dS_ext | dM]`` ([HV, K, V + K], state dtype) of sequence ``sequence`` given ``d_o``."""
    call = _call(cfg, inputs)
    return _backward_summary(call, _cp_sizes(call), d_o, sequence)


def _backward_summary(call: _abi.Call, sizes: _lib.CpSizes, d_o: torch.Tensor, sequence: int) -> torch.Tensor:
    """backward_summary of a call already planned (sizes)."""
    out = _empty_summary(call.inputs)
    workspace = call.buffer(sizes.backward_summary_workspace_bytes)
    d = _abi.describe_all(_core.TORCH, ("d_o", "out", "workspace"), (d_o, out, workspace))
    _lib.check(_lib.lib.fkt_cp_backward_summary(call.described.address, ctypes.byref(call.options), d.tensor(0),
                                                sequence, d.tensor(1), d.tensor(2), call.stream()))
    return out


def fold(summaries: torch.Tensor, first: int, count: int, backward: bool, state_v_first: bool,
         out: torch.Tensor) -> torch.Tensor:
    """Folds gathered summaries of ranks ``first .. first + count - 1`` into ``out`` (one state)."""
    d = _abi.describe_all(_core.TORCH, ("summaries", "out"), (summaries, out))
    stream = _core.TORCH.stream(out)
    _lib.check(_lib.lib.fkt_cp_fold(d.tensor(0), first, count, _lib.CP_BACKWARD if backward else _lib.CP_FORWARD,
                                    int(state_v_first), d.tensor(1), stream))
    return out


# ---------------------------------------------------------------------------------------------------
# The exchange and the autograd function.

class _Layout:
    """The rank's view of the context, checked against the process group."""

    def __init__(self, cp_context, num_seqs: int):
        self.group = getattr(cp_context, "group", None)
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("cp_context: context parallelism needs an initialised torch.distributed process group")
        self.world = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        self.pre = int(getattr(cp_context, "pre_num_ranks", 0) or 0)
        self.post = int(getattr(cp_context, "post_num_ranks", 0) or 0)
        self.num_seqs = num_seqs
        if self.pre < 0 or self.post < 0 or self.pre > self.rank or self.rank + self.post >= self.world:
            raise ValueError(f"cp_context: pre_num_ranks = {self.pre} and post_num_ranks = {self.post} do not fit "
                             f"rank {self.rank} of a group of {self.world}")
        if num_seqs < 1:
            raise ValueError("cp_context: the rank-local cu_seqlens must hold at least one sequence")

    def all_gather(self, summary: torch.Tensor) -> torch.Tensor:
        """[world, HV, K, V + K]: every rank's summary (zeros from ranks with nothing to send)."""
        # Concatenated along dim 0, the output shape every backend accepts (Gloo rejects a stacked one).
        gathered = summary.new_empty((self.world * summary.shape[0], *summary.shape[1:]))
        dist.all_gather_into_tensor(gathered, summary.contiguous(), group=self.group)
        return gathered.view(self.world, *summary.shape)


class _ChunkKDAContextParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, A_log, dt_bias, cfg, layout, cu_seqlens, cu_seqlens_cpu):
        inputs = _core.Inputs(q, k, v, g, beta, A_log, dt_bias, None, cu_seqlens, cu_seqlens_cpu)
        # Every rank plans (validates) the call before the exchange: an error on the ranks that
        # summarise must not leave the others waiting in the collective.
        call = _call(cfg, inputs)
        sizes = _cp_sizes(call)
        summary = _empty_summary(inputs)
        if layout.post > 0:
            summary = _forward_summary(call, sizes, layout.num_seqs - 1)
        gathered = layout.all_gather(summary)
        h0 = None
        if layout.pre > 0:
            shape = _core.state_shape(cfg, inputs, layout.num_seqs)
            h0 = torch.zeros(shape, dtype=_core.state_dtype(q), device=q.device)
            fold(gathered, layout.rank - layout.pre, layout.pre, False, cfg.state_v_first, h0[0])
        result = _core.forward(cfg, inputs._replace(initial_state=h0), False)
        # Only the first sequence's entering state is kept; backward expands it again. `saved`: what
        # the forward kept for its backward (T and P on CUDA), which does not depend on h0.
        ctx.save_for_backward(q, k, v, g, beta, A_log, dt_bias, h0[0] if h0 is not None else None, result.saved)
        o = result.o
        ctx.cfg, ctx.layout, ctx.cu = cfg, layout, (cu_seqlens, cu_seqlens_cpu)
        return o

    @staticmethod
    @torch.autograd.function.once_differentiable  # no second-order terms: create_graph then raises
    def backward(ctx, d_o):
        q, k, v, g, beta, A_log, dt_bias, first_state, saved = ctx.saved_tensors
        cfg, layout = ctx.cfg, ctx.layout
        inputs = _core.Inputs(q, k, v, g, beta, A_log, dt_bias, None, *ctx.cu)
        d_o = d_o.contiguous()
        # Every rank plans (validates) the call before the exchange, as the forward does.
        call = _call(cfg, inputs)
        sizes = _cp_sizes(call)
        summary = _empty_summary(inputs)
        if layout.pre > 0:
            summary = _backward_summary(call, sizes, d_o, 0)
        gathered = layout.all_gather(summary)
        shape = _core.state_shape(cfg, inputs, layout.num_seqs)
        d_final_state = None
        if layout.post > 0:
            d_final_state = torch.zeros(shape, dtype=_core.state_dtype(q), device=q.device)
            fold(gathered, layout.rank + 1, layout.post, True, cfg.state_v_first, d_final_state[-1])
        h0 = None
        if first_state is not None:
            h0 = torch.zeros(shape, dtype=first_state.dtype, device=first_state.device)
            h0[0] = first_state
        grads = _core.backward(cfg, inputs._replace(initial_state=h0), d_o, d_final_state, saved)
        return (grads.dq, grads.dk, grads.dv, grads.dg, grads.dbeta, grads.dA_log, grads.ddt_bias,
                None, None, None, None)


def chunk_kda(cfg: _core.Config, q, k, v, g, beta, A_log, dt_bias, cp_context) -> torch.Tensor:
    """The context-parallel op (``api.chunk_kda`` validates and resolves the arguments first).

    Returns ``o`` of the rank's slice; gradients flow through autograd.
    """
    cu_seqlens = cp_context.cu_seqlens
    cu_seqlens_cpu = getattr(cp_context, "cu_seqlens_cpu", None)
    if cu_seqlens_cpu is None:
        cu_seqlens_cpu = cu_seqlens.detach().cpu()
    if cu_seqlens.device != q.device:  # a context built from host offsets, used with CUDA tensors
        cu_seqlens = cu_seqlens.to(q.device)
    layout = _Layout(cp_context, int(cu_seqlens_cpu.numel()) - 1)
    # The context-parallel backward recomputes: it runs the slice again from the exchanged states.
    cfg = dataclasses.replace(cfg, disable_recompute=False)
    return _ChunkKDAContextParallel.apply(q, k, v, g, beta, A_log, dt_bias, cfg, layout, cu_seqlens, cu_seqlens_cpu)
