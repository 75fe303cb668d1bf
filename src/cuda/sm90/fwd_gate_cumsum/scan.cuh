// F1's arithmetic, shared by F2 (fwd_intra, which runs F1 on its chunk in shared memory) and the
// F1 kernel alone: the gate activation of one column (kda-math.md section 2.2) and its chunk-local
// inclusive cumsum (section 3.3), summed in row order as the CPU twin sums it.
#pragma once

#include "cuda/common/activation.cuh"
#include "cuda/common/convert.cuh"
#include "cuda/sm90/fwd_gate_cumsum/config.hpp"
#include "cuda/sm90/fwd_gate_cumsum/params.hpp"

namespace fkt::cuda {

// The part of a_t = activation(g_t) that is fixed for one column (value head, d).
struct ColumnGate {
  GateMode mode;
  float bias;   // dt_bias[head, d]; 0 when absent
  float rate;   // exp(A_log[head]); 1 when absent
  float lower;  // lambda of the bounded sigmoid

  // Calls f(activation), activation(g) = a_t on the SFU (activation.cuh): one branch-free function
  // per mode, so that a loop over a column's elements overlaps their SFU latencies (a branch on the
  // mode per element made each element wait for the one before).
  template <typename F>
  __device__ __forceinline__ void with_activation(F f) const {
    const float b = bias, r = rate, lo = lower;
    if (mode == GateMode::kPrecomputed) return f([](float g) { return g; });
    if (mode == GateMode::kSoftplus) return f([=](float g) { return -r * softplus_fast(g + b); });
    f([=](float g) { return lo * sigmoid_fast(r * (g + b)); });
  }
};

// The gate of value head `head` and column `column` = head * K + d.
__device__ __forceinline__ ColumnGate column_gate(const GateInputs& in, int head, int column) {
  return {in.mode, in.dt_bias ? load_float(in.dt_bias, in.dt_bias_dtype, column) : 0.f,
          in.A_log ? expf(load_float(in.A_log, in.A_log_dtype, head)) : 1.f, in.lower_bound};
}

// store(r, gamma_r) with gamma_r = sum of gate(g[i]) over i <= r, for the `rows` elements of one
// column, `stride` elements apart (gate: ColumnGate's activation, or the identity where the gate is
// applied already); returns the last gamma_r. store may write over g: a batch reads its rows before it
// stores them.
template <typename GT, typename Gate, typename Store>
__device__ __forceinline__ float scan_column(const GT* g, int64_t rows, int64_t stride, Gate gate, Store store) {
  constexpr int kBatch = GateCumsumConfig::kRowsInFlight;
  float sum = 0.f;
  for (int64_t r0 = 0; r0 < rows; r0 += kBatch) {
    // All loads of a batch are issued before the first use, and its gates computed before the
    // first sum: the rows' latencies overlap instead of adding up.
    float x[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) x[u] = r0 + u < rows ? to_float(g[(r0 + u) * stride]) : 0.f;
#pragma unroll
    for (int u = 0; u < kBatch; ++u) x[u] = gate(x[u]);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (r0 + u < rows) {
        sum += x[u];
        store(r0 + u, sum);
      }
    }
  }
  return sum;
}

}  // namespace fkt::cuda
