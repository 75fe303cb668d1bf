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

// A 3-d tensor of bf16, fp16 or fp32 elements (dims innermost first, the two outer strides in elements),
// read in boxes of 128 bytes of the innermost dim x box[1] x box[2] under the 128-byte swizzle.
CUtensorMap encode_3d(const void* base, DType dtype, const int64_t (&dims)[3], const int64_t (&strides)[2],
                      int box1, int box2) {
  FKT_CHECK(dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF32)
      << "internal: tensor maps of bf16, fp16 or fp32 rows";
  const int64_t bytes = dtype_bytes(dtype);
  const CUtensorMapDataType type = dtype == DType::kBF16  ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                   : dtype == DType::kF16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                          : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  const cuuint64_t sizes[3] = {static_cast<cuuint64_t>(dims[0]), static_cast<cuuint64_t>(dims[1]),
                               static_cast<cuuint64_t>(dims[2])};
  const cuuint64_t byte_strides[2] = {static_cast<cuuint64_t>(strides[0] * bytes),
                                      static_cast<cuuint64_t>(strides[1] * bytes)};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(128 / bytes), static_cast<cuuint32_t>(box1),
                             static_cast<cuuint32_t>(box2)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  CUtensorMap map{};
  const CUresult status = encode_tiled()(
      &map, type, 3,
      const_cast<void*>(base), sizes, byte_strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  FKT_CHECK(status == CUDA_SUCCESS) << "cuTensorMapEncodeTiled failed (" << static_cast<int>(status) << ") for a ["
                                    << dims[2] << ", " << dims[1] << ", " << dims[0] << "] tensor";
  return map;
}

}  // namespace

CUtensorMap row_tensor_map(const void* base, DType dtype, int64_t cols, int64_t heads, int64_t head_pitch,
                           int64_t tokens, int box_rows, int64_t token_pitch) {
  FKT_CHECK(tokens <= INT32_MAX) << "internal: 32-bit TMA token coordinates (check_supported), got " << tokens;
  return encode_3d(base, dtype, {cols, heads, tokens}, {head_pitch, token_pitch > 0 ? token_pitch : heads * head_pitch},
                   1, box_rows);
}

CUtensorMap block_tensor_map(const void* base, DType dtype, int64_t cols, int64_t rows, int64_t blocks,
                             int box_rows) {
  FKT_CHECK(box_rows <= 256 && rows <= INT32_MAX && blocks <= INT32_MAX)
      << "internal: TMA boxes of at most 256 rows and 32-bit coordinates, got " << box_rows << " rows of a [" << blocks
      << ", " << rows << ", " << cols << "] tensor";
  return encode_3d(base, dtype, {cols, rows, blocks}, {cols, rows * cols}, box_rows, 1);
}

}  // namespace fkt::cuda
