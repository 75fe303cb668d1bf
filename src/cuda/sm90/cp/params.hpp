// Arguments of the context-parallel kernels (kda-math.md section 9, fkt_cp_* in c_api.h).
#pragma once

#include <cstdint>

#include "cuda/sm90/backward/params.hpp"
#include "cuda/sm90/forward/params.hpp"

namespace fkt::cuda {

// The summaries run the ordinary stages' params on sequence `sequence` and write summary
// [HV, K, V + K] fp32, contiguous.
struct CpForwardSummaryParams {
  ForwardParams fwd;
  int64_t sequence;
  float* summary;
};

struct CpBackwardSummaryParams {
  BackwardParams bwd;
  int64_t sequence;
  float* summary;
};

struct CpFoldParams {
  const float* summaries;  // [R, HV, K, V + K] contiguous
  float* state;            // [HV, K, V] ([HV, V, K] if state_v_first) contiguous; may be nullptr
  // The forward's time slices (forward/pieces.hpp), "heads" being (sequence, value head) pairs: the
  // state to fold from, like `state` (zero when nullptr), and the state after each summary,
  // [count, HV, K, V] (or V, K), when set.
  const float* initial;
  float* after_each;
  int64_t first, count;    // ranks first .. first + count - 1
  int32_t HV, K, V;
  bool backward;           // fold from the last rank to the first (otherwise first to last)
  bool state_v_first;
};

// The fold on `stream` of the current device.
void fold_states(const CpFoldParams& params, void* stream);

}  // namespace fkt::cuda
