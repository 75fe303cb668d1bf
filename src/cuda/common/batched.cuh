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

}  // namespace fkt::cuda
