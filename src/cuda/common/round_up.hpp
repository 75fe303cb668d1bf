// Shared-memory tile dimensions are padded to whole hardware units: mma k-steps (8), row tiles
// (16), warp column groups (32).
#pragma once

namespace fkt::cuda {

// The number of blocks of `block` that cover `extent` (ceil(extent / block)).
template <typename I>
__host__ __device__ __forceinline__ constexpr I ceil_div(I extent, int block) {
  return (extent + block - 1) / block;
}

// x rounded up to a multiple of kM.
template <int kM>
__host__ __device__ constexpr int round_up(int x) {
  return (x + kM - 1) / kM * kM;
}

}  // namespace fkt::cuda
