// Shared-memory tile dimensions are padded to whole hardware units: mma k-steps (8), row tiles
// (16), warp column groups (32).
#pragma once

namespace fkt::cuda {

// x rounded up to a multiple of kM.
template <int kM>
__host__ __device__ constexpr int round_up(int x) {
  return (x + kM - 1) / kM * kM;
}

}  // namespace fkt::cuda
