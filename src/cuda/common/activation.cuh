// The gate and beta activations on the device (kda-math.md sections 2.2 and 2.3).
#pragma once

#include "core/problem.hpp"
#include "cuda/common/fast_exp.cuh"

namespace fkt::cuda {

// softplus and sigmoid exactly as the CPU twin evaluates them (precise expf/log1pf, threshold 20),
// so the two differ only by the last bits of the libraries.
__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

// beta as the recurrence takes it (kda-math.md 2.3): as given, or sigmoid (times 2 with
// allow_neg_eigval) of the logits; F2 and F4 form it alike.
__device__ __forceinline__ float activate_beta(BetaMode mode, float b) {
  if (mode == BetaMode::kPlain) return b;
  const float s = sigmoid(b);
  return mode == BetaMode::kSigmoid ? s : 2.f * s;
}

// The same on the SFU (ex2, lg2 and rcp approx.: relative errors about 2^-22, PTX ISA) and without
// branches, for the gate, which F2 evaluates for every element of a latency-bound kernel (with the
// precise forms, whose division and log1pf branch, F2's two runs at B1_T8192_H96 took 3.19 ms
// instead of 2.94), and for bwd_gate's gradient of it. Their absolute errors, under 1e-6, sit far
// below the fp32 rounding of the chunk cumsum they feed (gamma reaches hundreds). softplus of
// x < -16 comes out 0 where 1 + e^x rounds to 1 (the true value is below 1.2e-7).
__device__ __forceinline__ float rcp_fast(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float log2_fast(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float softplus_fast(float x) {
  return x > 20.f ? x : log2_fast(1.f + exp2_fast(x * kLog2e)) * (1.f / kLog2e);
}
__device__ __forceinline__ float sigmoid_fast(float x) { return rcp_fast(1.f + exp2_fast(-x * kLog2e)); }

}  // namespace fkt::cuda
