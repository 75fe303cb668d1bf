// The chunk states as the mma.sync readers take them (F5 after F4, B3's fallback): fp32 rows in
// shared memory, whatever the workspace keeps (ForwardWorkspace::states, half_states).
#pragma once

#include <cuda_fp16.h>

#include "cuda/common/scaled_half.cuh"
#include "cuda/common/tile_copy.cuh"
#include "cuda/sm90/forward/workspace.hpp"

namespace fkt::cuda {

// Loads (by the whole block) columns [e0, e0 + cols) of the K rows of the state entering chunk state
// block `block` (chunk * HV + value head) into fp32 shared memory dst [rows, ld]: widened from fp16
// by their row scales where the workspace keeps half states, else copied by cp.async (the caller
// commits). Rows >= K and columns >= valid_cols are zero.
__device__ __forceinline__ void load_state_rows(float* dst, int ld, const ForwardWorkspace& ws, int64_t block, int K,
                                                int V, int e0, int rows, int cols, int valid_cols) {
  const int64_t first = block * K * V + e0;
  if (ws.half_states) {
    load_scaled_half_rows(dst, ld, static_cast<const __half*>(ws.states) + first, V,
                          ws.state_scales + state_scales_at(block, e0, V, K), rows, cols, K, valid_cols);
  } else {
    copy_rows_async(dst, ld, static_cast<const float*>(ws.states) + first, V, rows, cols, K, valid_cols);
  }
}

}  // namespace fkt::cuda
