// Warp-level tensor-core products on fp32 data: mma.sync m16n8k8 with TF32 operands, in one of two
// precisions (Products, chosen per call in launch.cuh):
// - kSplit3: each operand split in two TF32 parts (x = hi + lo) and the three significant partial
//   products accumulated in fp32 (lo*hi terms apart). Close to an fp32 CUDA-core product (about
//   2^-21 relative per term instead of TF32's 2^-11), so the kernels keep the CPU twin's error
//   against the fp64 gold, at a fraction of the CUDA-core time.
// - kTf32: each operand rounded to TF32 once and one product: a third of the mma and none of the
//   split arithmetic, 2^-11 relative per operand (bfloat16 inputs carry 2^-8 themselves).
//
// PTX ISA, "Matrix fragments for mma.m16n8k8" (.tf32): with g = lane / 4 and t = lane % 4,
//   A (16 x 8, row):  a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)
//   B (8 x 8, col):   b0 (t, g), b1 (t + 4, g)
//   C (16 x 8):       c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1)
#pragma once

#include <cstdint>

#include "cuda/common/products.hpp"

namespace fkt::cuda {

struct SplitTf32 {
  uint32_t hi, lo;
};

// x rounded to the nearest TF32 (10 stored significand bits, the low 13 bits zero; ties to even):
// cvt.rn.tf32.f32 (PTX 7.8, sm_90) is one F2FP.TF32 instruction, where adding half an ulp to the
// bits and masking took two and a NaN check a third. Infinities stay infinite, NaN stays NaN.
__device__ __forceinline__ uint32_t round_tf32(float x) {
  uint32_t r;
  asm("cvt.rn.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// x rounded to TF32 as an fp32 value, for an operand stored where it is produced and read by TF32
// wgmma products (which truncate).
__device__ __forceinline__ float tf32_rounded(float x) { return __uint_as_float(round_tf32(x)); }

// kSplit3: x = hi + lo exactly (|lo| <= 2^-11 |x|); the mma reads lo's top 19 bits, so lo is
// truncated by the hardware at no cost (error <= 2^-21 |x|). kTf32: hi only (lo unused).
template <Products kP>
__device__ __forceinline__ SplitTf32 split_tf32(float x) {
  const uint32_t hi = round_tf32(x);
  if constexpr (kP == Products::kTf32) return {hi, 0u};
  else return {hi, __float_as_uint(x - __uint_as_float(hi))};
}

// x as an operand that TF32 holds exactly (stored rounded, common/mma_pairs.cuh, or a 16-bit input):
// kTf32 passes its bits, kSplit3 splits it.
template <Products kP>
__device__ __forceinline__ SplitTf32 stored_operand(float x) {
  if constexpr (kP == Products::kTf32) return {__float_as_uint(x), 0u};
  else return split_tf32<kP>(x);
}

// An operand element: split or rounded (split_tf32), or, kExact, one TF32 holds (stored_operand).
template <Products kP, bool kExact>
__device__ __forceinline__ SplitTf32 operand(float x) {
  if constexpr (kExact) return stored_operand<kP>(x);
  else return split_tf32<kP>(x);
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The A fragment of one k-step, split.
struct FragA {
  SplitTf32 x[4];
};

template <Products kP, bool kExact = false, typename LoadA>
__device__ __forceinline__ FragA load_frag_a(LoadA a, int k) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  return {{operand<kP, kExact>(a(g, k + t)), operand<kP, kExact>(a(g + 8, k + t)),
           operand<kP, kExact>(a(g, k + t + 4)), operand<kP, kExact>(a(g + 8, k + t + 4))}};
}

// The B fragment of one k-step and one 8-column tile, split.
struct FragB {
  SplitTf32 x, y;
};

// One k-step of one 16 x 8 tile: the lo*hi terms (kSplit3) into low, the hi*hi term into acc.
template <Products kP>
__device__ __forceinline__ void mma_terms(float (&low)[4], float (&acc)[4], const FragA& a, const FragB& b) {
  if constexpr (kP == Products::kSplit3) {
    mma_tf32(low, a.x[0].lo, a.x[1].lo, a.x[2].lo, a.x[3].lo, b.x.hi, b.y.hi);
    mma_tf32(low, a.x[0].hi, a.x[1].hi, a.x[2].hi, a.x[3].hi, b.x.lo, b.y.lo);
  }
  mma_tf32(acc, a.x[0].hi, a.x[1].hi, a.x[2].hi, a.x[3].hi, b.x.hi, b.y.hi);
}

// acc += A B for one 16 x 8 tile and one k-step, the B fragment given by its two split elements.
template <Products kP>
__device__ __forceinline__ void mma_split(float (&acc)[4], const FragA& a, SplitTf32 x, SplitTf32 y) {
  mma_terms<kP>(acc, acc, a, FragB{x, y});
}

// acc[n] += A B over the k-steps of 8 in [k_begin, k_end) for one warp, with a(k) -> FragA and
// b(k, n) -> FragB the fragments of the k-step at k (warp_mma's element reads, or the paired
// reads of common/mma_pairs.cuh).
// kSplit3: the lo*hi terms go to a second accumulator, added at the end: each accumulator's chain
// of dependent mma is one or two per k-step instead of three.
template <Products kP, int N, typename FragAAt, typename FragBAt>
__device__ __forceinline__ void mma_steps(float (&acc)[N][4], int k_begin, int k_end, FragAAt a, FragBAt b) {
  float low[N][4] = {};
  for (int k = k_begin; k < k_end; k += 8) {
    const FragA fa = a(k);
#pragma unroll
    for (int n = 0; n < N; ++n) {
      mma_terms<kP>(low[n], acc[n], fa, b(k, n));
    }
  }
  if constexpr (kP == Products::kSplit3) {
#pragma unroll
    for (int n = 0; n < N; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[n][i] += low[n][i];
    }
  }
}

// acc[n] += A[16, k_begin:k_end] B[k_begin:k_end, 8N] for one warp, over k-steps of 8 (the range
// a multiple of 8 long). a(row, k) and b(k, col) return fp32 elements, rows and columns in tile
// coordinates, k absolute; kExact: elements TF32 holds exactly (stored_operand).
template <Products kP, int N, bool kExact = false, typename LoadA, typename LoadB>
__device__ __forceinline__ void warp_mma(float (&acc)[N][4], int k_begin, int k_end, LoadA a, LoadB b) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  mma_steps<kP>(acc, k_begin, k_end, [&](int k) { return load_frag_a<kP, kExact>(a, k); }, [&](int k, int n) {
    return FragB{operand<kP, kExact>(b(k + t, 8 * n + g)), operand<kP, kExact>(b(k + t + 4, 8 * n + g))};
  });
}

// Tile coordinates of accumulator element i (0..3) of n-tile n. kInterleaved: the rows of an
// interleaved product (common/mma_pairs.cuh), where the lane's rows g and g + 8 are 2g and 2g + 1.
template <bool kInterleaved = false>
__device__ __forceinline__ int acc_row(int i) {
  const int g = threadIdx.x % 32 / 4;
  return kInterleaved ? 2 * g + (i >= 2 ? 1 : 0) : g + (i >= 2 ? 8 : 0);
}
__device__ __forceinline__ int acc_col(int n, int i) { return 8 * n + threadIdx.x % 4 * 2 + (i & 1); }

// Calls f(row, col, value) for each accumulator element of the lane, in tile coordinates.
template <bool kInterleaved = false, int N, typename F>
__device__ __forceinline__ void for_each_acc(const float (&acc)[N][4], F f) {
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) f(acc_row<kInterleaved>(i), acc_col(n, i), acc[n][i]);
  }
}

// Calls f(row, col, {element at col, element at col + 1}) for each pair of adjacent accumulator
// elements of the lane (a pair shares its row; col is even).
template <bool kInterleaved = false, int N, typename F>
__device__ __forceinline__ void for_each_acc_pair(const float (&acc)[N][4], F f) {
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int i = 0; i < 4; i += 2) {
      f(acc_row<kInterleaved>(i), acc_col(n, i), make_float2(acc[n][i], acc[n][i + 1]));
    }
  }
}

// acc element = f(row, col, element) for each accumulator element of the lane.
template <bool kInterleaved = false, int N, typename F>
__device__ __forceinline__ void transform_acc(float (&acc)[N][4], F f) {
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[n][i] = f(acc_row<kInterleaved>(i), acc_col(n, i), acc[n][i]);
  }
}

}  // namespace fkt::cuda
