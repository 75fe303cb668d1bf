// What B3 (bwd_wy_inter) hands to B4 (bwd_intra) in bf16 with bf16 inputs (kTf32 products): dA,
// and the dq and dk partials where B4 writes the final dq and dk to the outputs itself
// (qk_in_intra). Which hand-offs bf16 fits and what it costs in precision: docs/design.md, "The
// floor in bytes". A bf16 row sits in the first half of its fp32 row's slot, so the workspace and
// the row indices stay those of fp32. B4 then writes no slot of these arrays, so none of its warps
// reads a row that another has half overwritten.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "cuda/common/products.hpp"
#include "cuda/common/vec4.cuh"
#include "cuda/sm90/backward/params.hpp"

namespace fkt::cuda {

template <Products kP>
inline constexpr bool kBf16DA = kP == Products::kTf32;

template <Products kP>
__device__ __forceinline__ bool bf16_qk_partials(const BackwardParams& p) {
  return kP == Products::kTf32 && p.qk_in_intra;
}

// The bf16 view of the slot of fp32 row `row` in an array of `width` floats a row.
__device__ __forceinline__ __nv_bfloat16* bf16_row(float* base, int64_t row, int width) {
  return reinterpret_cast<__nv_bfloat16*>(base + row * width);
}

// Stores the first `count` of elements d to d + 3 of row `row` of a partial array, rounded to bf16
// (`bf16`) or as they are (`vector`: the fp32 row is 16-byte aligned and d a multiple of 4).
__device__ __forceinline__ void store_partial(float* base, int64_t row, int width, int d, float4 v, int count,
                                              bool vector, bool bf16) {
  if (bf16) store_first(bf16_row(base, row, width) + d, v, count, vector);
  else store_first(base + row * width + d, v, count, vector);
}

// Element d of a partial array's row, at `at` = row * width + d, as store_partial stored it.
__device__ __forceinline__ float load_partial(const float* base, int64_t at, int d, bool bf16) {
  return bf16 ? __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(base)[2 * at - d]) : base[at];
}

}  // namespace fkt::cuda
