// Launch shape of the state passes (fwd_state, bwd_state): shared by both kernels.
#pragma once

#include <cstddef>

namespace fkt::cuda {

struct StateConfig {
  static constexpr int kThreads = 256;
  static constexpr int kTileV = 32;               // state columns per block = one per lane
  static constexpr int kGroups = kThreads / 32;   // warps; warp w owns rows (or state rows) w, w + 8, ...
  static constexpr int kMaxPerThread = 128 / kGroups;  // K <= 128 state rows, C <= 64 chunk rows
  // fwd_state: two blocks per SM (both fit in shared memory; at most 128 registers a thread) so
  // one block's loads overlap the other's math. bwd_state's shared memory holds one block.
  static constexpr int kMinBlocksForward = 2;
  // K rounded up to 4: rows are read as float4, the padding is zero.
  __host__ __device__ static int padded(int K) { return (K + 3) / 4 * 4; }
  // fp32 shared memory: S [Kp, tile], W [C, Kp], K_down^T [Kp, C], delta [C, tile], gamma_L [Kp].
  static size_t smem_bytes(int C, int K) {
    const int Kp = padded(K);
    return sizeof(float) * (Kp * kTileV + 2 * C * Kp + C * kTileV + Kp);
  }
};

}  // namespace fkt::cuda
