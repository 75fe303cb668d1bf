// Sequence groups (docs/design.md, "Sequence groups"): the backward of varlen inputs runs B0 to B8
// on groups of consecutive whole sequences, one after the other, in the largest group's workspace.
// Sequences are independent, so a group is a varlen call of its own: its pointers start at its first
// token and sequence, and its offsets, rebased to its first token, lie in the workspace (written on
// the device from the call's: forward/chunk_offsets.cuh). Only the parameter gradients join the
// groups: their per-chunk partials fill one array over the call's chunks, reduced once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/problem.hpp"
#include "cuda/common/device_limits.hpp"
#include "cuda/common/round_up.hpp"
#include "cuda/sm90/forward/state_config.hpp"
#include "cuda/sm90/segments.hpp"

namespace fkt::cuda {

struct SequenceGroups {
  std::vector<int64_t> first;  // first sequence of each group, then N

  int64_t count() const { return static_cast<int64_t>(first.size()) - 1; }
};

namespace detail {

// The chunk row past sequence n's last chunk.
inline int64_t chunks_end(const Problem& p, int64_t n) {
  return n + 1 < p.N ? p.sequences[n + 1].chunk_offset : p.num_chunks;
}

// The first sequence of each group, then N, when groups of at most `bound` chunks (at least any one
// sequence's) are filled in order; empty when that makes more than `most` groups. A group ends
// before the first sequence that would take it past the bound: a binary search over the sequences'
// chunk offsets, so a call of many sequences costs a few searches, not a pass per bound tried.
inline std::vector<int64_t> fill_groups(const Problem& p, int64_t bound, int64_t most) {
  std::vector<int64_t> first{0};
  while (first.back() < p.N) {
    if (static_cast<int64_t>(first.size()) > most) return {};
    const int64_t limit = p.sequences[first.back()].chunk_offset + bound;
    int64_t lo = first.back(), hi = p.N;  // the first sequence ending past limit, N if none
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (chunks_end(p, mid) > limit) hi = mid;
      else lo = mid + 1;
    }
    first.push_back(lo);
  }
  return first;
}

}  // namespace detail

// Up to three groups of at least eight chunks on average, the largest group as small as it can be,
// for a recomputing varlen backward whose largest group holds at most half the call's chunks (no
// more than either of two head groups would: views.hpp) and whose every group gives the state
// passes a block per SM (sequences x value heads x V-tiles of 32 columns, the convention of the
// head groups; the wgmma passes take 64), so that no group leaves SMs without one. One group (the
// whole call) otherwise.
inline SequenceGroups sequence_groups(const Problem& p) {
  const SequenceGroups whole{{0, p.N}};
  if (!p.varlen || p.keep_forward) return whole;
  const int64_t groups = std::min(kMostParts, p.num_chunks / kLeastPartChunks);
  if (groups < 2) return whole;
  // The least bound on a group's chunks at which filling in order makes at most `groups` groups.
  int64_t lo = ceil_div(p.max_length, p.chunk), hi = p.num_chunks;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (!detail::fill_groups(p, mid, groups).empty()) hi = mid;
    else lo = mid + 1;
  }
  SequenceGroups best{detail::fill_groups(p, hi, groups)};
  if (best.count() < 2 || 2 * hi > p.num_chunks) return whole;
  const int64_t blocks_per_sequence = StateConfig::tiles(static_cast<int>(p.V)) * p.HV;
  for (int64_t g = 0; g < best.count(); ++g) {
    if ((best.first[g + 1] - best.first[g]) * blocks_per_sequence < device_limits(p.device.device_id).sms) {
      return whole;
    }
  }
  return best;
}

// Group g as a varlen call of its own: its tokens, chunks and sequences, rebased to its first ones.
inline Problem sequence_group_problem(const Problem& p, const SequenceGroups& groups, int64_t g) {
  const int64_t begin = groups.first[g], end = groups.first[g + 1];
  const Sequence first = p.sequences[begin];
  Problem part = p;
  part.sequences.assign(p.sequences.begin() + begin, p.sequences.begin() + end);
  part.N = end - begin;
  part.T = part.max_length = part.num_chunks = 0;
  for (Sequence& s : part.sequences) {
    s.t_begin -= first.t_begin;
    s.chunk_offset -= first.chunk_offset;
    part.T = s.t_begin + s.length;
    part.num_chunks = s.chunk_offset + ceil_div(s.length, p.chunk);
    part.max_length = std::max(part.max_length, s.length);
  }
  return part;
}

// The largest group in each extent (tokens, chunks, sequences): the problem the workspace that the
// groups share is carved for.
inline Problem sequence_group_bound(const Problem& p, const SequenceGroups& groups) {
  Problem bound = p;
  bound.T = bound.num_chunks = bound.N = 0;
  bound.sequences.clear();
  for (int64_t g = 0; g < groups.count(); ++g) {
    const int64_t begin = groups.first[g], end = groups.first[g + 1];
    const Sequence& first = p.sequences[begin];
    const int64_t tokens = (end < p.N ? p.sequences[end].t_begin : p.T) - first.t_begin;
    bound.T = std::max(bound.T, tokens);
    bound.num_chunks = std::max(bound.num_chunks, detail::chunks_end(p, end - 1) - first.chunk_offset);
    bound.N = std::max(bound.N, end - begin);
  }
  bound.max_length = bound.T;
  return bound;
}

}  // namespace fkt::cuda
