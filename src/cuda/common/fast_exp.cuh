// exp through the SFU's base-2 exponential: callers keep log decays pre-multiplied by log2(e), so
// each exp(a - b) is one subtraction and one ex2.approx (relative error about 2^-22, PTX ISA "ex2"),
// instead of the several instructions of the precise expf.
#pragma once

#include "cuda/common/tile_copy.cuh"
#include "cuda/common/vec4.cuh"

namespace fkt::cuda {

constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float exp2_fast(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Multiplies a [rows, cols] block of shared memory (row stride ld; cols and ld multiples of 4) by
// log2(e), by the whole block: log decays in the units exp2_fast takes.
__device__ __forceinline__ void to_log2_units(float* x, int rows, int cols, int ld) {
  for_each_cell<4>(rows, cols / 4, 0, ld, [&](int, int, int64_t, int s) {
    store4(x + s, map4([](float v) { return v * kLog2e; }, load4(x + s)));
  });
}

}  // namespace fkt::cuda
