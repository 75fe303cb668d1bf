// F1's first pass inside fwd_intra (forward/fwd_intra.cuh): the gate of every element of the chunk
// in shared memory, before the column sums that make gamma.
#pragma once

#include "cuda/common/convert.cuh"
#include "cuda/sm90/fwd_gate_cumsum/scan.cuh"

namespace fkt::cuda {

// The threads of F1's first pass (gate_rows): nthreads / Kp to a column (Kp <= 128 < nthreads),
// thread t on column t % Kp when t < nthreads / Kp * Kp.
__device__ __forceinline__ bool gates_a_column(int Kp) { return threadIdx.x < blockDim.x / Kp * Kp; }

// F1's first pass in shared memory: x[r, d] = a_t, the gate of g[r, d], for the rows r < rows and
// columns d < K of g ([C, ld_g] elements of G as loaded), and 0 for the other rows r < C and columns
// d < Kp of x ([C, ld_x] fp32; x may be g). A thread that gates_a_column passes the gate of its
// column, its rows in batches whose loads come before their stores: one shared-memory latency per
// batch, not per element.
template <typename G>
__device__ __forceinline__ void gate_rows(const G* g, int ld_g, float* x, int ld_x, int C, int rows, int K, int Kp,
                                          const ColumnGate& gate) {
  constexpr int kBatch = GateCumsumConfig::kRowsInFlight;
  const int per_column = blockDim.x / Kp, d = threadIdx.x % Kp;
  if (!gates_a_column(Kp)) return;
  gate.with_activation([&](auto activation) {
    for (int r0 = threadIdx.x / Kp; r0 < C; r0 += kBatch * per_column) {
      float a[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int r = r0 + u * per_column;
        a[u] = r < rows && d < K ? to_float(g[r * ld_g + d]) : 0.f;
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int r = r0 + u * per_column;
        const float a_t = activation(a[u]);  // computed for every row: no branch around the SFU chain
        if (r < C) x[r * ld_x + d] = r < rows && d < K ? a_t : 0.f;
      }
    }
  });
}

}  // namespace fkt::cuda
