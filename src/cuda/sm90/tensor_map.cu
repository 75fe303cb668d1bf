// Tensor maps through the driver's cuTensorMapEncodeTiled, reached through the runtime (no link to
// libcuda): a host-only encoding, no allocation, copy or synchronisation.
#include "cuda/sm90/tensor_map.hpp"

#include <cstdint>

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "core/error.hpp"
#include "cuda/common/check.cuh"

namespace fkt::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    FKT_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    FKT_CHECK(found == cudaDriverEntryPointSuccess && fn != nullptr)
        << "cuTensorMapEncodeTiled: not found in the CUDA driver (needed by the sm_90a state passes)";
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

}  // namespace

CUtensorMap row_tensor_map(const void* base, DType dtype, int64_t cols, int64_t heads, int64_t head_pitch,
                           int64_t tokens, int box_rows) {
  FKT_CHECK(dtype == DType::kBF16 || dtype == DType::kF32) << "internal: tensor maps of bf16 or fp32 rows";
  FKT_CHECK(tokens <= INT32_MAX) << "internal: 32-bit TMA token coordinates (check_supported), got " << tokens;
  const int64_t bytes = dtype == DType::kBF16 ? 2 : 4;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(tokens)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(head_pitch * bytes),
                                 static_cast<cuuint64_t>(heads * head_pitch * bytes)};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(128 / bytes), 1, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  CUtensorMap map{};
  const CUresult status = encode_tiled()(
      &map, dtype == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3,
      const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  FKT_CHECK(status == CUDA_SUCCESS) << "cuTensorMapEncodeTiled failed (" << static_cast<int>(status) << ") for a ["
                                    << tokens << ", " << heads << ", " << cols << "] tensor";
  return map;
}

}  // namespace fkt::cuda
