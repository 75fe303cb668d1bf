// intermediate_states, the state entering each chunk as the forward returns it on request.
#pragma once

#include <cstdint>

#include "cuda/common/convert.cuh"
#include "cuda/sm90/forward/params.hpp"

namespace fkt::cuda {

// Element (d, e) of the state entering a chunk, whose [K, V] block starts at `base`, into
// intermediate_states ([B, NT, HV, K, V] or [.., V, K], o's dtype). Out of line: a rarely asked
// output whose addressing would otherwise hold registers through a state pass's chunk loop.
__device__ __noinline__ void store_intermediate(const ForwardParams& p, int64_t base, int d, int e, float x) {
  const int64_t at = p.state_v_first ? static_cast<int64_t>(e) * p.K + d : static_cast<int64_t>(d) * p.V + e;
  store_float(p.intermediate_states, p.o_dtype, base + at, x);
}

}  // namespace fkt::cuda
