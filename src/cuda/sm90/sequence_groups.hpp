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

namespace fkt::cuda {

struct SequenceGroups {
  std::vector<int64_t> first;  // first sequence of each group, then N

  int64_t count() const { return static_cast<int64_t>(first.size()) - 1; }
};

namespace detail {

inline int64_t chunks_of(const Problem& p, int64_t n) { return ceil_div(p.sequences[n].length, p.chunk); }

// The first sequence of each group when groups of at most `bound` chunks are filled in order (each
// with at least one sequence), then N.
inline std::vector<int64_t> fill_groups(const Problem& p, int64_t bound) {
  std::vector<int64_t> first{0};
  int64_t filled = 0;
  for (int64_t n = 0; n < p.N; ++n) {
    const int64_t chunks = chunks_of(p, n);
    if (filled + chunks > bound && n > first.back()) {
      first.push_back(n);
      filled = 0;
    }
    filled += chunks;
  }
  first.push_back(p.N);
  return first;
}

}  // namespace detail

// Up to three groups of at least eight chunks on average, the largest group as small as it can be,
// for a recomputing varlen backward whose largest group holds at most half the call's chunks (fewer
// than two head groups would: views.hpp) and whose every group gives the state passes a block per
// SM (N sequences x value heads x V-tiles), so that each group takes no more waves than the call.
// One group (the whole call) otherwise.
inline SequenceGroups sequence_groups(const Problem& p) {
  constexpr int64_t kMostGroups = 3, kLeastChunks = 8;
  const SequenceGroups whole{{0, p.N}};
  if (!p.varlen || p.keep_forward) return whole;
  const int64_t groups = std::min(kMostGroups, p.num_chunks / kLeastChunks);
  if (groups < 2) return whole;
  // The least bound on a group's chunks at which filling in order makes at most `groups` groups.
  int64_t lo = 0, hi = p.num_chunks;
  for (int64_t n = 0; n < p.N; ++n) lo = std::max(lo, detail::chunks_of(p, n));
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (static_cast<int64_t>(detail::fill_groups(p, mid).size()) - 1 <= groups) hi = mid;
    else lo = mid + 1;
  }
  SequenceGroups best{detail::fill_groups(p, hi)};
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
  Problem bound = sequence_group_problem(p, groups, 0);
  for (int64_t g = 1; g < groups.count(); ++g) {
    const Problem part = sequence_group_problem(p, groups, g);
    bound.T = std::max(bound.T, part.T);
    bound.num_chunks = std::max(bound.num_chunks, part.num_chunks);
    bound.N = std::max(bound.N, part.N);
  }
  bound.max_length = bound.T;
  bound.sequences.clear();
  return bound;
}

}  // namespace fkt::cuda
