// F1 on CUDA: gate activation (kda-math.md section 2.2) and the chunk-local inclusive cumsum
// (section 3.3), written as gamma in natural log. Chunks restart at every sequence start (section 5).
#pragma once

#include "cuda/common/activation.cuh"
#include "cuda/common/convert.cuh"
#include "cuda/common/tile_copy.cuh"
#include "cuda/sm90/fwd_gate_cumsum/config.hpp"
#include "cuda/sm90/fwd_gate_cumsum/params.hpp"

namespace fkt::cuda {

// The part of a_t = activation(g_t) that is fixed for one column (value head, d).
struct ColumnGate {
  GateMode mode;
  float bias;   // dt_bias[head, d]; 0 when absent
  float rate;   // exp(A_log[head]); 1 when absent
  float lower;  // lambda of the bounded sigmoid

  __device__ __forceinline__ float operator()(float g) const {
    if (mode == GateMode::kPrecomputed) return g;
    const float x = g + bias;
    if (mode == GateMode::kSoftplus) return -rate * softplus(x);
    return lower * sigmoid(rate * x);
  }
};

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// The sequence of token t: the largest i with cu_seqlens[i] <= t, for 0 <= t < cu_seqlens[N].
// Empty sequences are never returned, since that largest i has cu_seqlens[i + 1] > t.
template <typename Offset>
__device__ __forceinline__ int64_t sequence_of(const Offset* cu_seqlens, int64_t N, int64_t t) {
  int64_t lo = 0, hi = N;
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (cu_seqlens[mid] <= t) lo = mid;
    else hi = mid;
  }
  return lo;
}

// One column of one chunk: `rows` token rows from `first_row` (rows of all batch rows are
// consecutive, `columns` elements apart); g and gamma already point at the column.
template <typename GT>
__device__ __forceinline__ void scan_chunk(const GT* __restrict__ g, float* __restrict__ gamma, int64_t first_row,
                                           int64_t rows, int32_t columns, const ColumnGate& gate) {
  constexpr int kBatch = GateCumsumConfig::kRowsInFlight;
  const GT* src = g + first_row * columns;
  float* dst = gamma + first_row * columns;
  float sum = 0.f;
  // The batches below wait on their loads one after another: L2 fetches all the rows first.
  for (int64_t r = 0; r < rows; ++r) prefetch_l2(src + r * columns);
  for (int64_t r0 = 0; r0 < rows; r0 += kBatch) {
    // All loads of a batch are issued before the first use: the gate's branches would otherwise
    // keep the compiler from overlapping one row's load with the previous row's math.
    float x[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) x[u] = r0 + u < rows ? to_float(src[(r0 + u) * columns]) : 0.f;
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (r0 + u < rows) {
        sum += gate(x[u]);
        dst[(r0 + u) * columns] = sum;
      }
    }
  }
}

// Grid: x = chunk (dense: batch row * chunks_per_row + chunk; varlen: a window of C tokens),
// y = group of GateCumsumConfig::kThreads columns.
template <typename GT, typename Offset>
__global__ void __launch_bounds__(GateCumsumConfig::kThreads)
    fwd_gate_cumsum_kernel(const __grid_constant__ GateCumsumParams params) {
  const int32_t column = blockIdx.y * GateCumsumConfig::kThreads + threadIdx.x;
  if (column >= params.columns) return;
  const int32_t head = column / params.K;
  const ColumnGate gate{params.gate,
                        params.dt_bias ? load_float(params.dt_bias, params.dt_bias_dtype, column) : 0.f,
                        params.A_log ? expf(load_float(params.A_log, params.A_log_dtype, head)) : 1.f,
                        params.lower_bound};
  const GT* g = static_cast<const GT*>(params.g) + column;
  float* gamma = params.gamma + column;
  const int64_t C = params.chunk;

  if (params.cu_seqlens == nullptr) {
    const int64_t b = blockIdx.x / params.chunks_per_row, j = blockIdx.x % params.chunks_per_row;
    scan_chunk(g, gamma, b * params.T + j * C, min64(C, params.T - j * C), params.columns, gate);
    return;
  }
  // Varlen has no chunk table on the device, so block x takes the chunks that start in the token
  // window [w0, w1). A sequence meeting the window starts at most one chunk in it (its chunk starts
  // are C apart) and every token lies in exactly one chunk, so every token is scanned exactly once.
  const Offset* cu_seqlens = static_cast<const Offset*>(params.cu_seqlens);
  const int64_t w0 = static_cast<int64_t>(blockIdx.x) * C, w1 = min64(w0 + C, params.T);
  const int64_t last = sequence_of(cu_seqlens, params.N, w1 - 1);
  for (int64_t i = sequence_of(cu_seqlens, params.N, w0); i <= last; ++i) {
    const int64_t begin = cu_seqlens[i], end = cu_seqlens[i + 1];
    const int64_t start = begin >= w0 ? begin : begin + (w0 - begin + C - 1) / C * C;
    if (start < min64(end, w1)) scan_chunk(g, gamma, start, min64(C, end - start), params.columns, gate);
  }
}

}  // namespace fkt::cuda
