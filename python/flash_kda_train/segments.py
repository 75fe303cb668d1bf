"""``chunk_kda(..., segment_size=N)``: the op run on consecutive token segments, the fp32 state of a
sequence cut by a segment boundary carried into the next segment (docs/design.md, "What backward
needs from forward, and the workspace"). Cuts fall on chunk boundaries of the sequence they cut,
so the chunks, and the result, are those of one call, while the CUDA workspace, which grows with
the tokens of a call, is one segment's. Autograd runs the segments' backwards in turn.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import torch


def plan(offsets: Sequence[int], segment_size: int, chunk: int) -> List[Tuple[int, int]]:
    """Token ranges [t0, t1) of at most segment_size tokens covering the packed tokens, each cut at
    a sequence start or at a chunk boundary of the sequence it falls in (segment_size is a multiple
    of chunk, so every range is non-empty)."""
    total, ranges, t0 = offsets[-1], [], 0
    while t0 < total:
        t1 = min(total, t0 + segment_size)
        if t1 < total:
            start = max(o for o in offsets if o <= t1)  # the sequence t1 falls in starts here
            t1 = start + (t1 - start) // chunk * chunk
        ranges.append((t0, t1))
        t0 = t1
    return ranges


def applies(q, segment_size: int, cu_seqlens, offsets: Optional[Sequence[int]],
            initial_state: Optional[torch.Tensor] = None) -> bool:
    """Whether a call holds more than one segment's tokens. Inputs the op refuses (wrong rank,
    malformed offsets or offsets of another dtype, packed with B > 1, initial states not one per
    sequence) go to it whole, for its error message."""
    if q.dim() != 4 or q.shape[1] <= segment_size:
        return False
    sequences = q.shape[0] if cu_seqlens is None else len(offsets) - 1 if offsets else 0
    if initial_state is not None and (initial_state.dim() != 4 or initial_state.shape[0] != sequences):
        return False
    if cu_seqlens is None:
        return True
    if offsets is None or cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64) or \
            cu_seqlens.shape[0] != len(offsets) or (cu_seqlens.device.type == "cpu" and cu_seqlens.tolist() != offsets):
        return False
    return len(offsets) >= 2 and offsets[0] == 0 and offsets[-1] == q.shape[1] and \
        all(a <= b for a, b in zip(offsets, offsets[1:])) and q.shape[0] == 1


def _members(offsets: Sequence[int], ranges: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """For each range, the sequences [first, last] it holds tokens of; an empty sequence goes with
    the range its offset falls in (the last range for one at the end)."""
    members = []
    for i, (t0, t1) in enumerate(ranges):
        last_range = i == len(ranges) - 1
        inside = [j for j in range(len(offsets) - 1)
                  if (offsets[j] < t1 and offsets[j + 1] > t0) or
                  (offsets[j] == offsets[j + 1] and (t0 <= offsets[j] < t1 or (last_range and offsets[j] == t1)))]
        members.append((inside[0], inside[-1]))
    return members


def run(op: Callable, segment_size: int, chunk: int, q, k, v, g, beta, initial_state: Optional[torch.Tensor],
        output_final_state: bool, cu_seqlens: Optional[torch.Tensor], offsets: Optional[Sequence[int]]):
    """o and the final state (None unless output_final_state) of op over the segments.

    op(q, k, v, g, beta, initial_state, cu_seqlens, cu_seqlens_cpu) runs one segment and returns
    (o, final_state). Dense inputs [B, T, ...] are cut along T for every batch row (pieces of
    batched inputs are strided and go to op contiguous); packed inputs (cu_seqlens, B = 1) along
    their tokens, with per-segment offsets computed on the device from cu_seqlens."""
    ranges = plan([0, q.shape[1]] if cu_seqlens is None else offsets, segment_size, chunk)
    sizes = [t1 - t0 for t0, t1 in ranges]
    pieces = [[p.contiguous() for p in torch.split(x, sizes, dim=1)] for x in (q, k, v, g, beta)]
    if cu_seqlens is None:
        return _run_dense(op, pieces, initial_state, output_final_state)
    return _run_packed(op, pieces, ranges, initial_state, output_final_state, cu_seqlens, offsets)


def _run_dense(op, pieces, initial_state, output_final_state):
    state, outputs = initial_state, []
    for q_s, k_s, v_s, g_s, beta_s in zip(*pieces):
        o_s, state = op(q_s, k_s, v_s, g_s, beta_s, state, None, None)
        outputs.append(o_s)
    return torch.cat(outputs, dim=1), (state if output_final_state else None)


def _run_packed(op, pieces, ranges, initial_state, output_final_state, cu_seqlens, offsets):
    members = _members(offsets, ranges)
    host = torch.tensor(list(offsets), dtype=torch.int64)
    outputs, finals, carry = [], [], None
    for (t0, t1), (first, last), piece in zip(ranges, members, zip(*pieces)):
        # The segment's offsets: its sequences' offsets shifted to t0 and clamped to the segment.
        seg_cu = (cu_seqlens[first:last + 2] - t0).clamp(0, t1 - t0)
        seg_host = (host[first:last + 2] - t0).clamp(0, t1 - t0)
        continues = carry is not None  # the first sequence began in an earlier segment
        parts = [carry] if continues else []
        rest = slice(first + 1 if continues else first, last + 1)
        if rest.start < rest.stop:
            if initial_state is not None:
                parts.append(initial_state[rest])
            elif continues:
                parts.append(carry.new_zeros((rest.stop - rest.start, *carry.shape[1:])))
        state = torch.cat(parts) if parts else None
        o_s, final_s = op(*piece, state, seg_cu, seg_host)
        outputs.append(o_s)
        ends_here = offsets[last + 1] <= t1
        carry = None if ends_here else final_s[-1:]
        finals.append(final_s if ends_here else final_s[:-1])
    o = torch.cat(outputs, dim=1)
    return o, (torch.cat(finals) if output_final_state else None)
