// Time segments (docs/design.md, "Time segments"): the backward of dense inputs of many chunks runs
// B0 to B8 on consecutive token ranges of every batch row, the last range first, in one range's
// workspace. Each range starts from the fp32 state entering it, which the forward keeps for the
// backward (`saved`, c_api.h; F4 writes it: ForwardParams::segment_states), and from the gradient
// of the state leaving it, which the later range returned. The state passes keep all their blocks
// (sequences x value heads x V-tiles), as a range holds every batch row.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/problem.hpp"
#include "cuda/common/round_up.hpp"

namespace fkt::cuda {

// At most three parts of the backward's time segments or sequence groups (sequence_groups.hpp),
// of at least eight chunks each: each part more costs the kernels' tails and launches.
constexpr int64_t kMostParts = 3, kLeastPartChunks = 8;

struct TimeSegments {
  int64_t count = 1;   // ranges of each batch row
  int64_t length = 0;  // tokens of each but the last: a multiple of the chunk size (T when one)

  int64_t begin(int64_t s) const { return s * length; }
  int64_t size(int64_t s, int64_t T) const { return std::min(length, T - begin(s)); }
};

// Up to three ranges of at least eight chunks each, of dense inputs whose backward recomputes (a
// forward workspace kept for it holds every token; varlen sequences end anywhere in a range).
inline TimeSegments time_segments(const Problem& p) {
  if (p.varlen || p.keep_forward) return {1, p.T};
  const int64_t chunks = ceil_div(p.T, p.chunk);
  const int count = static_cast<int>(std::min(kMostParts, chunks / kLeastPartChunks));
  if (count < 2) return {1, p.T};
  const int64_t length = ceil_div(chunks, count) * p.chunk;
  return {ceil_div(p.T, length), length};
}

// Elements of the fp32 states of one range start: N sequences x HV x K x V.
inline int64_t segment_state_elements(const Problem& p) { return p.N * p.HV * p.K * p.V; }

// The problem of one range of `tokens` tokens (the whole call's options, dense).
inline Problem segment_problem(const Problem& p, int64_t tokens) {
  Problem part = p;
  part.T = tokens;
  part.num_chunks = ceil_div(tokens, p.chunk);
  part.max_length = tokens;
  return part;
}

}  // namespace fkt::cuda
