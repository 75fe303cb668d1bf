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

FLA's zigzag layout (``build_cp_context(..., layout="zigzag")``) splits the tokens into
``2 world`` parts instead; rank ``r`` holds parts ``r`` and ``2 world - 1 - r`` (its local tokens
are the two parts one after the other), which balances the ranks' work when sequences are causal
and long. Each part is a slot of the chain above: every rank sends one summary per part in the same
all-gather, and the summaries are folded in slot order.

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
import operator
from typing import List, NamedTuple, Optional, Tuple

import torch
import torch.distributed as dist

from . import _abi, _core, _lib


@dataclasses.dataclass
class CPContext:
    """What one rank needs to run ``chunk_kda`` on its slice (the fields of FLA's ``FLACPContext``).

    ``cu_seqlens`` are the rank-local offsets (global boundaries clipped to the slice, shifted to
    start at 0); ``pre_num_ranks`` is how many earlier ranks the first local sequence continues from
    (0: it starts on this rank), ``post_num_ranks`` how many later ranks the last local sequence
    continues on (0: it ends on this rank). ``group`` is the process group (None: the default group,
    where FLA's op takes None as context parallelism switched off).

    With ``layout == "zigzag"`` the rank holds two parts of ``part_len`` tokens (chain slots ``rank``
    and ``2 world - 1 - rank``), the first ``front_num_seqs`` local sequences in the first; the two
    counts are per part, in slots, in ``pre_num_ranks_by_part`` and ``post_num_ranks_by_part``, and
    ``pre_num_ranks`` and ``post_num_ranks`` are None, as FLA has them.
    """

    group: Optional[dist.ProcessGroup] = None
    cu_seqlens: Optional[torch.Tensor] = None
    cu_seqlens_cpu: Optional[torch.Tensor] = None
    pre_num_ranks: Optional[int] = 0
    post_num_ranks: Optional[int] = 0
    layout: str = "contiguous"
    part_len: Optional[int] = None
    front_num_seqs: Optional[int] = None
    pre_num_ranks_by_part: Optional[Tuple[int, int]] = None
    post_num_ranks_by_part: Optional[Tuple[int, int]] = None

    @property
    def is_first_rank(self) -> Optional[bool]:
        """True when the first local sequence starts on this rank (None with the zigzag layout)."""
        return None if self.pre_num_ranks is None else self.pre_num_ranks == 0

    @property
    def is_last_rank(self) -> Optional[bool]:
        """True when the last local sequence ends on this rank (None with the zigzag layout)."""
        return None if self.post_num_ranks is None else self.post_num_ranks == 0

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
                     world_size: Optional[int] = None, layout: str = "contiguous") -> CPContext:
    """The context of this rank from the GLOBAL ``cu_seqlens`` of the packed batch.

    The ``T`` tokens are split into ``world_size`` contiguous slices of ``T / world_size`` tokens
    (``T`` must be divisible); rank ``r`` holds tokens ``[r T / world, (r + 1) T / world)``. With
    ``layout="zigzag"`` (FLA's) they are split into ``2 world_size`` parts and rank ``r`` holds parts
    ``r`` and ``2 world_size - 1 - r``, in that order. Empty sequences are dropped (they have no
    tokens on any rank). ``rank`` and ``world_size`` default to those of ``group`` (torch.distributed
    must then be initialised); pass them to build the context of any rank without a process group.
    """
    if layout not in ("contiguous", "zigzag"):
        raise ValueError(f"layout: expected 'contiguous' or 'zigzag', got {layout!r}")
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
    parts = world_size if layout == "contiguous" else 2 * world_size
    if total == 0 or total % parts:
        what = "world_size" if layout == "contiguous" else "2 world_size"
        raise ValueError(f"cu_seqlens: context parallelism splits the T = {total} packed tokens into {what} = "
                         f"{parts} equal parts; T must be a positive multiple of {what}")
    part = total // parts

    def interval(slot):
        """This slot's local offsets, and how many slots its first sequence continues from and its last on."""
        start, end = slot * part, (slot + 1) * part
        # The non-empty global sequences overlapping [start, end), in order; they tile the part.
        spans = [(a, b) for a, b in zip(offsets, offsets[1:]) if b > a and a < end and b > start]
        local = [0] + [min(b, end) - start for _, b in spans]
        return local, slot - spans[0][0] // part, (spans[-1][1] - 1) // part - slot

    if layout == "contiguous":
        local, pre, post = interval(rank)
        local_cpu = torch.tensor(local, dtype=torch.int64)
        return CPContext(group=group, cu_seqlens=local_cpu.to(cu_seqlens.device), cu_seqlens_cpu=local_cpu,
                         pre_num_ranks=pre, post_num_ranks=post)
    front, front_pre, front_post = interval(rank)
    back, back_pre, back_post = interval(2 * world_size - 1 - rank)
    local_cpu = torch.tensor(front + [part + x for x in back[1:]], dtype=torch.int64)
    return CPContext(group=group, cu_seqlens=local_cpu.to(cu_seqlens.device), cu_seqlens_cpu=local_cpu,
                     pre_num_ranks=None, post_num_ranks=None, layout="zigzag", part_len=part,
                     front_num_seqs=len(front) - 1, pre_num_ranks_by_part=(front_pre, back_pre),
                     post_num_ranks_by_part=(front_post, back_post))


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

class _Part(NamedTuple):
    """One chain slot a rank holds: its local sequences first .. last, and how many slots its first
    sequence continues from (pre) and its last continues on (post)."""

    slot: int
    first: int
    last: int
    pre: int
    post: int


def _count(value, what: str) -> int:
    """A count of the context as an int (None: 0)."""
    if value is None:
        return 0
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"cp_context: {what} must be an integer, got {value!r}") from None


class _Layout:
    """The rank's view of the context, checked against the process group and its local offsets."""

    def __init__(self, cp_context, offsets: List[int]):
        layout = getattr(cp_context, "layout", "contiguous")
        if layout not in ("contiguous", "zigzag"):
            raise ValueError(f"cp_context: layout {layout!r} is not supported; expected 'contiguous' or 'zigzag'")
        self.group = getattr(cp_context, "group", None)
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("cp_context: context parallelism needs an initialised torch.distributed process group")
        self.world = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        self.num_seqs = num_seqs = len(offsets) - 1
        if num_seqs < 1:
            raise ValueError("cp_context: the rank-local cu_seqlens must hold at least one sequence")
        if layout == "contiguous":
            pre = _count(getattr(cp_context, "pre_num_ranks", 0), "pre_num_ranks")
            post = _count(getattr(cp_context, "post_num_ranks", 0), "post_num_ranks")
            self.slots = self.world
            self.parts = [_Part(self.rank, 0, num_seqs - 1, pre, post)]
            if not self._fit(self.parts):
                raise ValueError(f"cp_context: pre_num_ranks = {pre} and post_num_ranks = {post} do not fit "
                                 f"rank {self.rank} of a group of {self.world}")
        else:
            self.slots = 2 * self.world
            self.parts = self._zigzag_parts(cp_context, offsets)
        # A continued sequence must have tokens here (FLA's graph mode pads the offsets with empty ones).
        for part in self.parts:
            for sequence, count, what in ((part.first, part.pre, "starts earlier"),
                                          (part.last, part.post, "ends later")):
                if count > 0 and offsets[sequence + 1] == offsets[sequence]:
                    raise ValueError(f"cp_context: local sequence {sequence} {what} but is empty here (local "
                                     f"cu_seqlens {offsets}); a rank's offsets hold no empty sequence where one "
                                     f"continues")

    def _zigzag_parts(self, cp_context, offsets: List[int]) -> List[_Part]:
        part_len = _count(getattr(cp_context, "part_len", None), "part_len")
        front = _count(getattr(cp_context, "front_num_seqs", None), "front_num_seqs")
        pre = getattr(cp_context, "pre_num_ranks_by_part", None)
        post = getattr(cp_context, "post_num_ranks_by_part", None)
        if not all(isinstance(counts, (tuple, list)) and len(counts) == 2 for counts in (pre, post)):
            raise ValueError(f"cp_context: a zigzag layout needs pre_num_ranks_by_part and post_num_ranks_by_part "
                             f"(two counts each), got {pre!r} and {post!r}")
        num_seqs = self.num_seqs
        if part_len < 1 or offsets[-1] != 2 * part_len or not 1 <= front < num_seqs or offsets[front] != part_len:
            raise ValueError(f"cp_context: a zigzag layout holds two parts of part_len = {part_len} tokens, the first "
                             f"front_num_seqs = {front} local sequences in the first; the local cu_seqlens "
                             f"{offsets} do not match")
        slots = (self.rank, self.slots - 1 - self.rank)
        parts = [_Part(slots[0], 0, front - 1, _count(pre[0], "pre_num_ranks_by_part"),
                       _count(post[0], "post_num_ranks_by_part")),
                 _Part(slots[1], front, num_seqs - 1, _count(pre[1], "pre_num_ranks_by_part"),
                       _count(post[1], "post_num_ranks_by_part"))]
        if not self._fit(parts):
            raise ValueError(f"cp_context: pre_num_ranks_by_part = {tuple(pre)} and post_num_ranks_by_part = "
                             f"{tuple(post)} do not fit slots {slots} of {self.slots}")
        if slots[1] == slots[0] + 1 and (parts[0].post > 0) != (parts[1].pre > 0):  # the middle: one rank, both sides
            raise ValueError(f"cp_context: slots {slots} are adjacent, so the first part's last sequence continues "
                             f"into the second exactly when the second's first comes from the first; got "
                             f"post_num_ranks_by_part = {tuple(post)} and pre_num_ranks_by_part = {tuple(pre)}")
        return parts

    def _fit(self, parts: List[_Part]) -> bool:
        """Whether every part's sequences continue from and on slots of the chain."""
        return all(0 <= part.pre <= part.slot and 0 <= part.post < self.slots - part.slot for part in parts)

    def firsts(self) -> List[int]:
        """The local index of each part's first sequence."""
        return [part.first for part in self.parts]

    def all_gather(self, summaries: torch.Tensor) -> torch.Tensor:
        """[slots, HV, K, V + K]: every slot's summary in chain order, from this rank's [parts, HV, K, V + K]
        (zeros for a part with nothing to send)."""
        # Concatenated along dim 0, the output shape every backend accepts (Gloo rejects a stacked one).
        gathered = summaries.new_empty((self.world * summaries.shape[0], *summaries.shape[1:]))
        dist.all_gather_into_tensor(gathered, summaries.contiguous(), group=self.group)
        by_rank = gathered.view(self.world, *summaries.shape)
        if len(self.parts) == 1:
            return by_rank[:, 0]
        # Zigzag: slot s < world is rank s's first part, slot s >= world rank 2 world - 1 - s's second.
        return torch.cat([by_rank[:, 0], by_rank.flip(0)[:, 1]])


class _ChunkKDAContextParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, A_log, dt_bias, cfg, layout, cu_seqlens, cu_seqlens_cpu):
        inputs = _core.Inputs(q, k, v, g, beta, A_log, dt_bias, None, cu_seqlens, cu_seqlens_cpu)
        # Every rank plans (validates) the call before the exchange: an error on the ranks that
        # summarise must not leave the others waiting in the collective.
        call = _call(cfg, inputs)
        sizes = _cp_sizes(call)
        summaries = torch.stack([_forward_summary(call, sizes, part.last) if part.post > 0 else _empty_summary(inputs)
                                 for part in layout.parts])
        gathered = layout.all_gather(summaries)
        h0 = None
        if any(part.pre > 0 for part in layout.parts):
            shape = _core.state_shape(cfg, inputs, layout.num_seqs)
            h0 = torch.zeros(shape, dtype=_core.state_dtype(q), device=q.device)
            for part in layout.parts:
                if part.pre > 0:
                    fold(gathered, part.slot - part.pre, part.pre, False, cfg.state_v_first, h0[part.first])
        result = _core.forward(cfg, inputs._replace(initial_state=h0), False)
        # Only the parts' first sequences' entering states are kept; backward expands them again.
        # `saved`: what the forward kept for its backward (T and P on CUDA), which does not depend on h0.
        entering = h0[layout.firsts()] if h0 is not None else None
        ctx.save_for_backward(q, k, v, g, beta, A_log, dt_bias, entering, result.saved)
        o = result.o
        ctx.cfg, ctx.layout, ctx.cu = cfg, layout, (cu_seqlens, cu_seqlens_cpu)
        return o

    @staticmethod
    @torch.autograd.function.once_differentiable  # no second-order terms: create_graph then raises
    def backward(ctx, d_o):
        q, k, v, g, beta, A_log, dt_bias, entering, saved = ctx.saved_tensors
        cfg, layout = ctx.cfg, ctx.layout
        inputs = _core.Inputs(q, k, v, g, beta, A_log, dt_bias, None, *ctx.cu)
        d_o = d_o.contiguous()
        # Every rank plans (validates) the call before the exchange, as the forward does.
        call = _call(cfg, inputs)
        sizes = _cp_sizes(call)
        summaries = torch.stack([_backward_summary(call, sizes, d_o, part.first) if part.pre > 0
                                 else _empty_summary(inputs) for part in layout.parts])
        gathered = layout.all_gather(summaries)
        shape = _core.state_shape(cfg, inputs, layout.num_seqs)
        d_final_state = None
        if any(part.post > 0 for part in layout.parts):
            d_final_state = torch.zeros(shape, dtype=_core.state_dtype(q), device=q.device)
            for part in layout.parts:
                if part.post > 0:
                    fold(gathered, part.slot + 1, part.post, True, cfg.state_v_first, d_final_state[part.last])
        h0 = None
        if entering is not None:
            h0 = torch.zeros(shape, dtype=entering.dtype, device=entering.device)
            h0[layout.firsts()] = entering
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
    layout = _Layout(cp_context, [int(x) for x in cu_seqlens_cpu.reshape(-1).tolist()])
    # The context-parallel backward recomputes: it runs the slice again from the exchanged states.
    cfg = dataclasses.replace(cfg, disable_recompute=False)
    return _ChunkKDAContextParallel.apply(q, k, v, g, beta, A_log, dt_bias, cfg, layout, cu_seqlens, cu_seqlens_cpu)
