// Warp-level tensor-core products on fp16 operands in shared memory: mma.sync m16n8k16 (fp32
// accumulators), its fragments loaded by ldmatrix.
//
// PTX ISA, "Matrix fragments for mma.m16n8k16" (.f16), with g = lane / 4 and t = lane % 4, each
// register two adjacent k (the lower k in the low half):
//   A (16 x 16, row): a0 (g, 2t..2t+1), a1 (g + 8, 2t..), a2 (g, 2t+8..), a3 (g + 8, 2t+8..)
//   B (16 x 8, col):  b0 (2t..2t+1, g), b1 (2t+8..2t+9, g)
//   C (16 x 8):       as m16n8k8's (common/mma.cuh, for_each_acc)
// ldmatrix.x4 loads four 8 x 8 matrices of 16-bit elements, matrix m from the row addresses of lanes
// 8m .. 8m + 7 (16-byte aligned), and gives lane L elements 2(L % 4), 2(L % 4) + 1 of row L / 4 of
// each: an A fragment when the matrices are the tile's (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15),
// (8-15, 8-15); the B fragments of two 8-column tiles when they are the rows (n) and k of an
// operand stored with k along its rows, (n 0-7, k 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15).
#pragma once

#include <cstdint>

#include <cuda_fp16.h>

#include "cuda/common/shared_address.cuh"

namespace fkt::cuda {

// The four matrices at the lane's row address `row` (a shared-memory pointer). The memory clobber
// keeps the load after the barrier that published the rows.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row))
               : "memory");
}

// The lane's row address for ldmatrix_x4 of the A fragment of the 16 x 16 tile at `tile` (rows
// `ld` elements apart).
__device__ __forceinline__ const __half* a_fragment_row(const __half* tile, int ld) {
  const int lane = threadIdx.x % 32;
  return tile + (lane % 16) * ld + lane / 16 * 8;
}

// The lane's row address for ldmatrix_x4 of the B fragments {b0, b1} of n-tile 0 then n-tile 1 of
// the 16 (n) x 16 (k) tile at `tile` (n rows `ld` elements apart, k along them).
__device__ __forceinline__ const __half* b_fragments_row(const __half* tile, int ld) {
  const int lane = threadIdx.x % 32;
  return tile + (lane / 16 * 8 + lane % 8) * ld + lane / 8 % 2 * 8;
}

__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two fp32 values as the fp16 pair of one fragment register (x in the low half), rounded to nearest.
__device__ __forceinline__ uint32_t half_pair(float x, float y) {
  const __half2 h = __floats2half2_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// The elementwise fp16 product of two fragment registers, rounded to nearest.
__device__ __forceinline__ uint32_t half_pair_product(uint32_t a, uint32_t b) {
  const __half2 h = __hmul2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
  return *reinterpret_cast<const uint32_t*>(&h);
}

}  // namespace fkt::cuda
