// fp16 rows with a power-of-two scale per row: the chunk states and their gradients as the wgmma
// state passes store them and bwd_wy_inter reads them (docs/design.md, "The states in fp16 with a
// scale per row"). With the scale the least power of two at or above the row's largest magnitude,
// x / scale lies in [-1, 1] and keeps fp16's 11 significant bits (TF32's) down to 2^-14 of that
// magnitude; widening multiplies by the scale again, exactly.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>

namespace fkt::cuda {

// The least power of two at or above m (finite, m >= 0), at least 2^-100: a row of zeros (or of
// values below 2^-114) needs some scale, and any is exact for it.
__device__ __forceinline__ float power_of_two_at_least(float m) {
  const uint32_t bits = __float_as_uint(fmaxf(m, 0x1p-100f));
  return __uint_as_float((bits + 0x007fffffu) & 0x7f800000u);
}

// x times inv (the inverse of a row's scale) as four fp16, rounded to nearest, packed for one
// 8-byte store.
__device__ __forceinline__ uint2 scaled_halves(float4 x, float inv) {
  const __half2 lo = __floats2half2_rn(x.x * inv, x.y * inv), hi = __floats2half2_rn(x.z * inv, x.w * inv);
  return make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
}

// Stores (by the whole block of kThreads) kRows rows of 64 fp32 values staged in shared memory
// (cell c of row r, 4 values, at src + at(r, c), 16 cells a row) as fp16 rows, row r at
// dst + r * stride elements, and each row's scale at scales[r]. Eight threads share a row: thread c
// reads cells c and c + 8 (under the staging tiles' swizzle, cell ^ (r % 8), the eight read
// different banks) and stores their columns 4c .. 4c + 3 and 32 + 4c .. 32 + 4c + 3.
template <int kThreads, int kRows, typename At>
__device__ __forceinline__ void store_scaled_half_rows(__half* dst, int64_t stride, float* scales, const char* src,
                                                       At at) {
  static_assert(kThreads % 32 == 0 && kRows % (kThreads / 8) == 0, "every thread takes the same number of rows");
  const int c = static_cast<int>(threadIdx.x % 8);
  for (int r = static_cast<int>(threadIdx.x / 8); r < kRows; r += kThreads / 8) {
    const float4 a = *reinterpret_cast<const float4*>(src + at(r, c));
    const float4 b = *reinterpret_cast<const float4*>(src + at(r, c + 8));
    float m = fmaxf(fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(a.z), fabsf(a.w))),
                    fmaxf(fmaxf(fabsf(b.x), fabsf(b.y)), fmaxf(fabsf(b.z), fabsf(b.w))));
#pragma unroll
    for (int lanes = 1; lanes < 8; lanes *= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, lanes));
    const float scale = power_of_two_at_least(m), inv = __frcp_rn(scale);  // exact: a power of two
    __half* const row = dst + r * stride;
    *reinterpret_cast<uint2*>(row + 4 * c) = scaled_halves(a, inv);
    *reinterpret_cast<uint2*>(row + 32 + 4 * c) = scaled_halves(b, inv);
    if (c == 0) scales[r] = scale;
  }
}

// Eight fp16 values (a 16-byte cell) times `scale`, as two float4.
__device__ __forceinline__ void widen_cell(uint4 cell, float scale, float4& lo, float4& hi) {
  const __half2* h = reinterpret_cast<const __half2*>(&cell);
  const float2 a = __half22float2(h[0]), b = __half22float2(h[1]), c = __half22float2(h[2]), d = __half22float2(h[3]);
  lo = make_float4(a.x * scale, a.y * scale, b.x * scale, b.y * scale);
  hi = make_float4(c.x * scale, c.y * scale, d.x * scale, d.y * scale);
}

// Loads (by the whole block) a [rows, cols] block of fp16 rows (row stride `stride` elements), row r
// times scales[r], into fp32 shared memory with row stride ld, zero-filling rows >= valid_rows and
// columns >= valid_cols: one element per thread and step, for the passes off the wgmma path.
__device__ __forceinline__ void load_scaled_half_rows(float* dst, int ld, const __half* src, int64_t stride,
                                                      const float* scales, int rows, int cols, int valid_rows,
                                                      int valid_cols) {
  for (int x = static_cast<int>(threadIdx.x); x < rows * cols; x += static_cast<int>(blockDim.x)) {
    const int r = x / cols, c = x % cols;
    dst[r * ld + c] = r < valid_rows && c < valid_cols ? __half2float(src[r * stride + c]) * scales[r] : 0.f;
  }
}

}  // namespace fkt::cuda
