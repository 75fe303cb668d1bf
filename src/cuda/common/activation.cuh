// The gate and beta activations on the device (kda-math.md sections 2.2 and 2.3).
#pragma once

namespace fkt::cuda {

// softplus and sigmoid exactly as the CPU twin evaluates them (precise expf/log1pf, threshold 20),
// so the two differ only by the last bits of the libraries.
__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

}  // namespace fkt::cuda
