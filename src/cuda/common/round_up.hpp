// Shared-memory tile dimensions are padded to whole hardware units: mma k-steps (8), row tiles
// (16), warp column groups (32); 16-bit rows to strides free of bank conflicts.
#pragma once

namespace fkt::cuda {

// The number of blocks of `block` that cover `extent` (ceil(extent / block)).
template <typename I>
__host__ __device__ __forceinline__ constexpr I ceil_div(I extent, int block) {
  return (extent + block - 1) / block;
}

// x rounded up to a multiple of kM.
template <int kM>
__host__ __device__ constexpr int round_up(int x) {
  return (x + kM - 1) / kM * kM;
}

// The row stride, in elements, of a shared-memory tile of 16-bit rows of `extent` elements whose
// mma fragments two lanes read per 32-bit word: 8 (mod 64) keeps those reads free of bank
// conflicts, and rows a multiple of 16 bytes apart (cp.async).
__host__ __device__ constexpr int ld_rows16(int extent) { return round_up<64>(extent) + 8; }

}  // namespace fkt::cuda
