// Block-strided loops whose global loads overlap: each thread issues the loads of kBatch elements
// before it uses any of them. A plain strided loop that stores between loads waits one full memory
// latency per element (the compiler cannot move a load above a store that may alias it), which is
// what bounded the stage kernels' load phases.
#pragma once

namespace fkt::cuda {

// For x in [0, count), strided over the block: v = load(x), then use(x, v).
template <int kBatch = 4, typename Load, typename Use>
__device__ __forceinline__ void batched(int count, Load load, Use use) {
  using Value = decltype(load(0));
  for (int x0 = threadIdx.x; x0 < count; x0 += kBatch * blockDim.x) {
    Value v[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int x = x0 + b * blockDim.x;
      if (x < count) v[b] = load(x);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int x = x0 + b * blockDim.x;
      if (x < count) use(x, v[b]);
    }
  }
}

// The same over this thread's cells x = threadIdx.x + j * blockDim.x, j < kCells (count <= kCells *
// blockDim.x): use(j, x, v) gets j as a constant of the unrolled loops, so what a thread keeps per
// cell from one such pass to another over the same count stays in registers.
template <int kCells, int kBatch, typename Load, typename Use>
__device__ __forceinline__ void batched_cells(int count, Load load, Use use) {
  static_assert(kCells % kBatch == 0, "whole batches");
  using Value = decltype(load(0));
#pragma unroll
  for (int j0 = 0; j0 < kCells; j0 += kBatch) {
    Value v[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int x = threadIdx.x + (j0 + b) * blockDim.x;
      if (x < count) v[b] = load(x);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int x = threadIdx.x + (j0 + b) * blockDim.x;
      if (x < count) use(j0 + b, x, v[b]);
    }
  }
}

}  // namespace fkt::cuda
