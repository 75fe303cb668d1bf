// The fold of gathered context-parallel summaries (fkt_cp_fold), and of the forward's time slices
// (forward/pieces.hpp): every state column evolves alone, col <- X_r[:, V:] col + X_r[:, e], over
// ranks in order (forward) or last to first (backward).
#pragma once

#include <cstddef>

#include "cuda/sm90/cp/params.hpp"

namespace fkt::cuda {

struct FoldConfig {
  static constexpr int kThreads = 256;
  static constexpr int kTile = 32;                   // state columns per block = one per lane
  static constexpr int kGroups = kThreads / kTile;  // warp w owns the state rows w, w + 8, ...
  // fp32 shared memory: the column tile before and after one rank's map, [K, kTile] each.
  static size_t smem_bytes(int K) { return sizeof(float) * 2 * K * kTile; }
};

// One block per (value head, column tile). A summary row is read by a whole warp at once (one
// broadcast per element), its S_ext entries coalesced across the lanes. fp32, fixed order.
__global__ void __launch_bounds__(FoldConfig::kThreads) cp_fold_kernel(const __grid_constant__ CpFoldParams p) {
  constexpr int kTile = FoldConfig::kTile, kGroups = FoldConfig::kGroups;
  const int head = blockIdx.x, e0 = blockIdx.y * kTile;
  const int K = p.K, V = p.V, W = V + K;
  const int e = threadIdx.x % kTile, group = threadIdx.x / kTile;
  const bool column = e0 + e < V;
  // Two [K, kTile] buffers: step i reads the column tile from buffer i % 2 and writes buffer 1 - i % 2.
  extern __shared__ float smem[];
  const auto buffer = [&](int64_t i) { return smem + (i % 2) * K * kTile; };
  // Element (d, e0 + e) of a state of this head.
  const auto at = [&](int d) {
    return static_cast<int64_t>(head) * K * V +
           (p.state_v_first ? static_cast<int64_t>(e0 + e) * K + d : static_cast<int64_t>(d) * V + e0 + e);
  };
  const int64_t state_elements = static_cast<int64_t>(p.HV) * K * V;

  for (int d = group; d < K; d += kGroups) smem[d * kTile + e] = p.initial != nullptr && column ? p.initial[at(d)] : 0.f;
  __syncthreads();
  for (int64_t step = 0; step < p.count; ++step) {
    const int64_t r = p.backward ? p.first + p.count - 1 - step : p.first + step;
    const float* X = p.summaries + (r * p.HV + head) * static_cast<int64_t>(K) * W;
    const float* col = buffer(step);
    float* next = buffer(step + 1);
    for (int d = group; d < K; d += kGroups) {
      const float* row = X + static_cast<int64_t>(d) * W;
      float acc = column ? row[e0 + e] : 0.f;
      for (int f = 0; f < K; ++f) acc += row[V + f] * col[f * kTile + e];
      next[d * kTile + e] = acc;
      if (p.after_each != nullptr && column) p.after_each[step * state_elements + at(d)] = acc;
    }
    __syncthreads();  // next is complete, and col is free for the step after
  }
  if (!column || p.state == nullptr) return;
  const float* col = buffer(p.count);
  for (int d = group; d < K; d += kGroups) p.state[at(d)] = col[d * kTile + e];
}

}  // namespace fkt::cuda
