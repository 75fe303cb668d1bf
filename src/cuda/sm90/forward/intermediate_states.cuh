// intermediate_states, the state entering each chunk as the forward returns it on request, and the
// fp32 states entering the time segments (segment_states), which it keeps for the backward.
#pragma once

#include <cstdint>

#include "cuda/common/convert.cuh"
#include "cuda/sm90/forward/params.hpp"

namespace fkt::cuda {

// Element (d, e) of the state entering a chunk, whose [K, V] block starts at `base`, into
// intermediate_states ([B, NT, HV, K, V] or [.., V, K], o's dtype). Out of line: a rarely asked
// output whose addressing would otherwise hold registers through a state pass's chunk loop.
inline __device__ __noinline__ void store_intermediate(const ForwardParams& p, int64_t base, int d, int e, float x) {
  const int64_t at = p.state_v_first ? static_cast<int64_t>(e) * p.K + d : static_cast<int64_t>(d) * p.V + e;
  store_float(p.intermediate_states, p.o_dtype, base + at, x);
}

// The first chunk from a block's first, `begin`, on that starts a time segment other than a
// sequence's first, when segment_states is set, else none (-1): a state pass's chunk loop compares
// its chunk with it and advances it by segment_chunks after a store (no division per chunk).
__device__ __forceinline__ int64_t first_segment_start(const ForwardParams& p, int64_t begin) {
  if (p.segment_states == nullptr) return -1;
  const int64_t later = (begin + p.segment_chunks - 1) / p.segment_chunks;  // segments starting at or after it
  return p.segment_chunks * (later > 1 ? later : 1);
}

// The states entering the time segment that chunk j starts, in segment_states: a tensor like the
// initial state, whose element (d, e) of (sequence n, value head) is at state_index(p, n, head, d, e).
__device__ __forceinline__ float* segment_states_at(const ForwardParams& p, int64_t j) {
  return p.segment_states + (j / p.segment_chunks - 1) * (p.N * p.io_HV * static_cast<int64_t>(p.K) * p.V);
}

}  // namespace fkt::cuda
