// Element loads that widen every supported float dtype to fp32 (fp64 is narrowed, as on the CPU).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/tensor.hpp"

namespace fkt::cuda {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

// Element i of a small parameter tensor whose dtype is known only at run time (A_log, dt_bias).
__device__ __forceinline__ float load_float(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kBF16: return to_float(static_cast<const __nv_bfloat16*>(base)[i]);
    case DType::kF16: return to_float(static_cast<const __half*>(base)[i]);
    case DType::kF32: return static_cast<const float*>(base)[i];
    default: return static_cast<float>(static_cast<const double*>(base)[i]);
  }
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

}  // namespace fkt::cuda
