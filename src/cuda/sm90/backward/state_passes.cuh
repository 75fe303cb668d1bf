// The backward's two state passes in one launch, where both run on wgmma: B0's F4 (the states and
// delta again, fwd_state_wgmma<__half>) and B2 (the state gradient, bwd_state_wgmma). Neither reads
// what the other writes (B2 reads W, Q_up, K_down, gamma_L, dO and P, all written before), and
// each walks its chunks one after the other with few blocks when the sequences are few (one per
// sequence, value head and 64-column V-tile): side by side they take the SMs that each leaves idle.
// Grid z picks the pass, x and y are each pass's own.
#pragma once

#include <algorithm>

#include "cuda/sm90/backward/bwd_state_wgmma.cuh"
#include "cuda/sm90/forward/fwd_state_wgmma.cuh"

namespace fkt::cuda {

struct StatePassesParams {
  FwdStateWgmmaParams forward;
  BwdStateWgmmaParams backward;
};

// The larger of the two passes' shared memory: the least that each block needs (the launch asks
// for all that a block may have, so that each block has an SM to itself).
inline constexpr int kStatePassesBytes =
    std::max(FwdStateWgmmaLayout<__half>::launch_bytes, BwdStateWgmmaLayout::launch_bytes);

__global__ void __launch_bounds__(BwdStateWgmmaLayout::kThreads, 2)
    state_passes_kernel(const __grid_constant__ StatePassesParams params) {
  static_assert(FwdStateWgmmaLayout<__half>::kThreads == BwdStateWgmmaLayout::kThreads, "one block size");
  if (blockIdx.z == 0) fwd_state_wgmma<__half>(params.forward, 0);
  else bwd_state_wgmma(params.backward);
}

}  // namespace fkt::cuda
