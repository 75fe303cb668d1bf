// Element loads that widen every supported float dtype to fp32 (fp64 is narrowed, as on the CPU).
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/tensor.hpp"

namespace fkt::cuda {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

// x rounded to nearest as a T (bf16, fp16 or fp32): the inverse of to_float.
template <typename T>
__device__ __forceinline__ T from_float(float x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(x);
  else if constexpr (std::is_same_v<T, __half>) return __float2half_rn(x);
  else return x;
}

// Bytes of one element of a supported dtype (the device twin of dtype_bytes).
__device__ __forceinline__ int element_bytes(DType dtype) {
  return dtype == DType::kF64 ? 8 : dtype == DType::kF32 ? 4 : 2;
}

// Element i of a small parameter tensor whose dtype is known only at run time (A_log, dt_bias).
__device__ __forceinline__ float load_float(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kBF16: return to_float(static_cast<const __nv_bfloat16*>(base)[i]);
    case DType::kF16: return to_float(static_cast<const __half*>(base)[i]);
    case DType::kF32: return static_cast<const float*>(base)[i];
    default: return static_cast<float>(static_cast<const double*>(base)[i]);
  }
}

// Element i of a run-time dtype as its raw bits (load_bits), widened where it is used (from_bits):
// the load's latency then ends at the widening, not inside the dtype's branch, so that a load
// issued a step ahead is waited for only when its value is needed.
__device__ __forceinline__ uint64_t load_bits(const void* base, DType dtype, int64_t i) {
  switch (element_bytes(dtype)) {
    case 8: return static_cast<const uint64_t*>(base)[i];
    case 4: return static_cast<const uint32_t*>(base)[i];
    default: return static_cast<const uint16_t*>(base)[i];
  }
}

__device__ __forceinline__ float from_bits(uint64_t bits, DType dtype) {
  switch (dtype) {
    case DType::kBF16: return __uint_as_float(static_cast<uint32_t>(bits) << 16);
    case DType::kF16: return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
    case DType::kF32: return __uint_as_float(static_cast<uint32_t>(bits));
    default: return static_cast<float>(__longlong_as_double(static_cast<long long>(bits)));
  }
}

// The first `count` elements from element i of a bf16, fp16 or fp32 row as fp32 (the others read as
// zero): one 4-element load when `vector` (element i and the row's base 4-element aligned) and
// count >= 4, else one load per element.
__device__ __forceinline__ float4 load_first(const void* base, DType dtype, int64_t i, int count, bool vector) {
  if (vector && count >= 4) {
    if (dtype == DType::kF32) return *reinterpret_cast<const float4*>(static_cast<const float*>(base) + i);
    const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const char*>(base) + 2 * i);
    if (dtype == DType::kBF16) {
      const auto* e = reinterpret_cast<const __nv_bfloat16*>(&raw);
      return {to_float(e[0]), to_float(e[1]), to_float(e[2]), to_float(e[3])};
    }
    const auto* e = reinterpret_cast<const __half*>(&raw);
    return {to_float(e[0]), to_float(e[1]), to_float(e[2]), to_float(e[3])};
  }
  float e[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (j < count) e[j] = load_float(base, dtype, i + j);
  }
  return {e[0], e[1], e[2], e[3]};
}

}  // namespace fkt::cuda

namespace fkt::cuda {

// Stores x, rounded to nearest, as element i of an output whose dtype is known only at run time.
__device__ __forceinline__ void store_float(void* base, DType dtype, int64_t i, float x) {
  switch (dtype) {
    case DType::kBF16: static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(x); break;
    case DType::kF16: static_cast<__half*>(base)[i] = __float2half_rn(x); break;
    case DType::kF64: static_cast<double*>(base)[i] = x; break;
    default: static_cast<float*>(base)[i] = x; break;
  }
}

// Whether output rows of `row_stride` elements from `base` hold their element pairs (2j, 2j + 1)
// at addresses aligned for one 2-element store.
__device__ __forceinline__ bool pairs_aligned(const void* base, DType dtype, int64_t row_stride) {
  return row_stride % 2 == 0 && reinterpret_cast<uintptr_t>(base) % (2 * element_bytes(dtype)) == 0;
}

// Stores x.x and x.y, rounded to nearest, as elements i and i + 1 (the second only when `both`):
// one 2-element store when `paired` (i even, pairs_aligned), else as store_float.
__device__ __forceinline__ void store_pair(void* base, DType dtype, int64_t i, float2 x, bool both, bool paired) {
  if (!paired || !both) {
    store_float(base, dtype, i, x.x);
    if (both) store_float(base, dtype, i + 1, x.y);
    return;
  }
  switch (dtype) {
    case DType::kBF16:
      *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(base) + i) = __floats2bfloat162_rn(x.x, x.y);
      break;
    case DType::kF16: *reinterpret_cast<__half2*>(static_cast<__half*>(base) + i) = __floats2half2_rn(x.x, x.y); break;
    case DType::kF64: *reinterpret_cast<double2*>(static_cast<double*>(base) + i) = make_double2(x.x, x.y); break;
    default: *reinterpret_cast<float2*>(static_cast<float*>(base) + i) = x; break;
  }
}

}  // namespace fkt::cuda
