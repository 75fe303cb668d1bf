// Tensor maps (TMA descriptors) of the workspace's row tensors, encoded on the host per call.
#pragma once

#include <cstdint>

#include <cuda.h>

#include "core/tensor.hpp"

namespace fkt::cuda {

// A [tokens, heads, cols] tensor of 16-bit or fp32 rows (a row's elements contiguous, heads
// head_pitch elements apart, tokens token_pitch apart: heads * head_pitch when 0, more for a view of
// some heads of a tensor) read in boxes of 128 bytes of one row (64 16-bit or 32 fp32 columns) x one
// head x box_rows tokens, under the 128-byte swizzle: coordinates (first column, head, first token).
// Rows past the tensor read as zero.
CUtensorMap row_tensor_map(const void* base, DType dtype, int64_t cols, int64_t heads, int64_t head_pitch,
                           int64_t tokens, int box_rows, int64_t token_pitch = 0);

// A [blocks, rows, cols] tensor of contiguous [rows, cols] blocks read in boxes of 128 bytes of a
// row x box_rows rows (at most 256) of one block, under the 128-byte swizzle: coordinates (first
// column, first row, block). The chunk states [chunks, HV, K, V], as [chunks, HV * K, V], take
// boxes of one head's K rows.
CUtensorMap block_tensor_map(const void* base, DType dtype, int64_t cols, int64_t rows, int64_t blocks,
                             int box_rows);

}  // namespace fkt::cuda
