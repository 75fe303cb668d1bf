// exp through the SFU's base-2 exponential: callers keep log decays pre-multiplied by log2(e), so
// each exp(a - b) is one subtraction and one ex2.approx (relative error about 2^-22, PTX ISA "ex2"),
// instead of the several instructions of the precise expf.
#pragma once

namespace fkt::cuda {

constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float exp2_fast(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace fkt::cuda
