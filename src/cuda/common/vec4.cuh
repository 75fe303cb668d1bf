// Four consecutive fp32 columns of a row as one float4: the element-wise stages move and compute
// them together (one 16-byte access instead of four, one index computation for four elements).
// Shared-memory rows are padded to multiples of 4 floats, so load4 / store4 are always aligned
// there; global rows are when their stride and base are (the `vector` argument below).
#pragma once

#include <cuda_bf16.h>

namespace fkt::cuda {

__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float2 load2(const float* p) { return *reinterpret_cast<const float2*>(p); }

// Two adjacent bf16 as fp32 (exact: the bits move up).
__device__ __forceinline__ float2 load2(const __nv_bfloat16* p) {
  const uint32_t bits = *reinterpret_cast<const uint32_t*>(p);
  return make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xffff0000u));
}
__device__ __forceinline__ void store4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }

// Two adjacent elements at p, one store (p aligned to two elements); bf16 rounded to nearest.
__device__ __forceinline__ void store2(float* p, float2 v) { *reinterpret_cast<float2*>(p) = v; }
__device__ __forceinline__ void store2(__nv_bfloat16* p, float2 v) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v.x, v.y);
}

// f applied column by column: {f(a.x, b.x, ...), ..., f(a.w, b.w, ...)}.
template <typename F, typename... Float4>
__device__ __forceinline__ float4 map4(F f, Float4... a) {
  return {f(a.x...), f(a.y...), f(a.z...), f(a.w...)};
}

// a . b, summed in the order x, y, z, w.
__device__ __forceinline__ float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

// The first `count` floats at p (the others read as zero): one 16-byte load when `vector` (p is
// 16-byte aligned) and count >= 4, else one load per element.
__device__ __forceinline__ float4 load_first(const float* p, int count, bool vector) {
  if (vector && count >= 4) return load4(p);
  float e[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (j < count) e[j] = p[j];
  }
  return {e[0], e[1], e[2], e[3]};
}

// Stores the first `count` floats of v at p, as load_first reads them.
__device__ __forceinline__ void store_first(float* p, float4 v, int count, bool vector) {
  if (vector && count >= 4) return store4(p, v);
  const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (j < count) p[j] = e[j];
  }
}

// Stores the first `count` elements of v at p rounded to bf16: one 8-byte store when `vector` (p
// is 8-byte aligned) and count >= 4, else one store per element.
__device__ __forceinline__ void store_first(__nv_bfloat16* p, float4 v, int count, bool vector) {
  if (vector && count >= 4) {
    const __nv_bfloat162 low = __floats2bfloat162_rn(v.x, v.y), high = __floats2bfloat162_rn(v.z, v.w);
    *reinterpret_cast<uint2*>(p) =
        make_uint2(*reinterpret_cast<const unsigned*>(&low), *reinterpret_cast<const unsigned*>(&high));
    return;
  }
  const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (j < count) p[j] = __float2bfloat16_rn(e[j]);
  }
}

}  // namespace fkt::cuda
