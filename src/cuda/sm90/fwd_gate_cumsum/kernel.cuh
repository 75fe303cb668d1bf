// F1 alone on CUDA, for the stage hook fkt_stage_gate_cumsum: gate activation (kda-math.md section
// 2.2) and the chunk-local inclusive cumsum (section 3.3), written as gamma in natural log. Chunks
// restart at every sequence start (section 5). The run path runs the same arithmetic (scan.cuh)
// inside F2, on the chunk that fwd_intra holds in shared memory.
#pragma once

#include "cuda/common/tile_copy.cuh"
#include "cuda/sm90/fwd_gate_cumsum/scan.cuh"

namespace fkt::cuda {

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
__device__ __forceinline__ void scan_chunk(const GT* g, float* gamma, int64_t first_row, int64_t rows, int32_t columns,
                                           const ColumnGate& gate) {
  const GT* src = g + first_row * columns;
  // scan_column's batches wait on their loads one after another: L2 fetches all the rows first.
  for (int64_t r = 0; r < rows; ++r) prefetch_l2(src + r * columns);
  float* dst = gamma + first_row * columns;
  gate.with_activation([&](auto activation) {
    scan_column(src, rows, columns, activation, [&](int64_t r, float sum) { dst[r * columns] = sum; });
  });
}

// Grid: x = chunk (dense: batch row * chunks_per_row + chunk; varlen: a window of C tokens),
// y = group of GateCumsumConfig::kThreads columns.
template <typename GT, typename Offset>
__global__ void __launch_bounds__(GateCumsumConfig::kThreads)
    fwd_gate_cumsum_kernel(const __grid_constant__ GateCumsumParams params) {
  const int32_t column = blockIdx.y * GateCumsumConfig::kThreads + threadIdx.x;
  if (column >= params.columns) return;
  const ColumnGate gate = column_gate(params.gate, column / params.K, column);
  const GT* g = static_cast<const GT*>(params.gate.g) + column;
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
