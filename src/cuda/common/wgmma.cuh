// Warpgroup tensor-core products (sm_90a wgmma) on bf16 operands in shared memory, fp32
// accumulators in registers: the tensor cores read each operand once per warpgroup of four warps,
// where mma.sync has every warp load its own fragments (the state passes' bound: their B operands
// were read by four warps each).
//
// PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate":
// - Operands in the canonical layout without swizzle: core matrices of 8 rows x 16 bytes, each 128
//   contiguous bytes. K-major: a core matrix's rows run along M (or N), its 16 bytes along K;
//   MN-major (the transposed operand, bf16 only): rows along K, bytes along M (or N). The
//   descriptor's leading byte offset steps between core matrices along K, its stride byte offset
//   along M (or N). CoreMatrices below places them as [MN / 8][K / 8][8][16 bytes].
// - The accumulator of m64nNk16: warp w of the warpgroup holds rows 16w + g and 16w + g + 8
//   (g = lane / 4) at columns 8j + 2t, 8j + 2t + 1 (t = lane % 4), element 4j + i as mma.sync's
//   m16n8 element i of n-tile j (common/mma.cuh): float acc[N / 8][4].
// - Generic-proxy writes to shared memory (st.shared, cp.async) reach wgmma's reads only through
//   fence.proxy.async before the barrier that publishes them; wgmma.fence orders the accumulator
//   registers' earlier writes before the products.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

namespace fkt::cuda {

// Byte offsets of a [mn, k] bf16 operand of kKExtent k in the canonical layout: core matrices
// along K kLeading = 128 bytes apart, along MN kStride = kKExtent / 8 * 128.
template <int kKExtent>
struct CoreMatrices {
  static_assert(kKExtent % 16 == 0, "whole k-steps of 16");
  static constexpr uint32_t kLeading = 128, kStride = kKExtent / 8 * kLeading;
  static constexpr int bytes(int mn_extent) { return mn_extent * kKExtent * 2; }
  // K-major: element (mn, k), k = 8c .. 8c + 7 forming one 16-byte row of a core matrix.
  __device__ static __forceinline__ uint32_t k_major(int mn, int k) {
    return mn / 8 * kStride + k / 8 * kLeading + mn % 8 * 16 + k % 8 * 2;
  }
  // MN-major: element (mn, k), mn = 8c .. 8c + 7 forming one 16-byte row of a core matrix.
  __device__ static __forceinline__ uint32_t mn_major(int mn, int k) {
    return mn / 8 * kStride + k / 8 * kLeading + k % 8 * 16 + mn % 8 * 2;
  }
  // The descriptor of the operand from `base` (16-byte aligned): its first mn_block * 8 rows skipped
  // and the k-step of 16 at k0.
  __device__ static __forceinline__ uint64_t descriptor(const void* base, int mn_block, int k0) {
    const uint32_t at =
        static_cast<uint32_t>(__cvta_generic_to_shared(base)) + mn_block * kStride + k0 / 8 * kLeading;
    return static_cast<uint64_t>((at & 0x3ffffu) >> 4) | static_cast<uint64_t>(kLeading >> 4) << 16 |
           static_cast<uint64_t>(kStride >> 4) << 32;
  }
};

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most kPending of the warpgroup's committed groups of products are still running.
template <int kPending = 0>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// p, opaque to the compiler: descriptors formed from it in a loop's body are formed there, where
// hoisted out of the loop they would hold a register each through it (fwd_state_wgmma's output
// variant, 64 columns: 136 bytes of spill with its descriptors hoisted out of the chunk loop, 44
// without).
__device__ __forceinline__ char* unhoisted(char* p) {
  asm volatile("" : "+l"(p));
  return p;
}

// Keeps the compiler from moving an accumulator's reads or writes across a wgmma wait or fence.
template <int N>
__device__ __forceinline__ void pin_accumulator(float (&acc)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+f"(acc[n][i])::"memory");
  }
}

// acc += kScaleA A B, one m64nNk16 product (N = 16, 32 or 64) of bf16 operands given by their
// descriptors; kTransA / kTransB: the operand is MN-major; kScaleA: 1 or -1. The predicate p
// (scale-d) is true: accumulate.
template <int kTransA, int kTransB, int kScaleA = 1>
__device__ __forceinline__ void wgmma_bf16(float (&acc)[2][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, %10, 1, "
      "%11, %12;\n}\n"
      : "+f"(acc[0][0]), "+f"(acc[0][1]), "+f"(acc[0][2]), "+f"(acc[0][3]), "+f"(acc[1][0]), "+f"(acc[1][1]),
        "+f"(acc[1][2]), "+f"(acc[1][3])
      : "l"(a), "l"(b), "n"(kScaleA), "n"(kTransA), "n"(kTransB));
}

template <int kTransA, int kTransB, int kScaleA = 1>
__device__ __forceinline__ void wgmma_bf16(float (&acc)[4][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15}, %16, %17, p, %18, 1, %19, %20;\n}\n"
      : "+f"(acc[0][0]), "+f"(acc[0][1]), "+f"(acc[0][2]), "+f"(acc[0][3]), "+f"(acc[1][0]), "+f"(acc[1][1]),
        "+f"(acc[1][2]), "+f"(acc[1][3]), "+f"(acc[2][0]), "+f"(acc[2][1]), "+f"(acc[2][2]), "+f"(acc[2][3]),
        "+f"(acc[3][0]), "+f"(acc[3][1]), "+f"(acc[3][2]), "+f"(acc[3][3])
      : "l"(a), "l"(b), "n"(kScaleA), "n"(kTransA), "n"(kTransB));
}

template <int kTransA, int kTransB, int kScaleA = 1>
__device__ __forceinline__ void wgmma_bf16(float (&acc)[8][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, "
      "%33, p, %34, 1, %35, %36;\n}\n"
      : "+f"(acc[0][0]), "+f"(acc[0][1]), "+f"(acc[0][2]), "+f"(acc[0][3]), "+f"(acc[1][0]), "+f"(acc[1][1]),
        "+f"(acc[1][2]), "+f"(acc[1][3]), "+f"(acc[2][0]), "+f"(acc[2][1]), "+f"(acc[2][2]), "+f"(acc[2][3]),
        "+f"(acc[3][0]), "+f"(acc[3][1]), "+f"(acc[3][2]), "+f"(acc[3][3]), "+f"(acc[4][0]), "+f"(acc[4][1]),
        "+f"(acc[4][2]), "+f"(acc[4][3]), "+f"(acc[5][0]), "+f"(acc[5][1]), "+f"(acc[5][2]), "+f"(acc[5][3]),
        "+f"(acc[6][0]), "+f"(acc[6][1]), "+f"(acc[6][2]), "+f"(acc[6][3]), "+f"(acc[7][0]), "+f"(acc[7][1]),
        "+f"(acc[7][2]), "+f"(acc[7][3])
      : "l"(a), "l"(b), "n"(kScaleA), "n"(kTransA), "n"(kTransB));
}

// acc += A B over k = 0 .. kKExtent - 1, one product per k-step: A [64, k] and B [N, k] bf16
// operands in the canonical layout (CoreMatrices<kKExtent>), A K-major (kTransA = 0) or MN-major
// from its row block a_block (8 rows each), B MN-major from its column block b_block.
template <int kKExtent, int kTransA, int N>
__device__ __forceinline__ void wgmma_over_k(float (&acc)[N][4], const char* a, int a_block, const char* b,
                                             int b_block) {
  using Operand = CoreMatrices<kKExtent>;
#pragma unroll
  for (int k0 = 0; k0 < kKExtent; k0 += 16) {
    wgmma_bf16<kTransA, 1>(acc, Operand::descriptor(a, a_block, k0), Operand::descriptor(b, b_block, k0));
  }
}

// acc += kScaleA A (B_hi + B_lo) over k = 0 .. kKExtent - 1, one product per part and k-step: A
// [64, k] and B's parts [N, k] bf16 operands in the canonical layout (CoreMatrices<kKExtent>), A
// K-major (kTransA = 0) or MN-major from its row block a_block (8 rows each), B MN-major from its
// column block b_block.
template <int kKExtent, int kTransA, int kScaleA = 1, int N>
__device__ __forceinline__ void wgmma_split_b(float (&acc)[N][4], const char* a, int a_block, const char* b_hi,
                                              const char* b_lo, int b_block) {
  using Operand = CoreMatrices<kKExtent>;
#pragma unroll
  for (int k0 = 0; k0 < kKExtent; k0 += 16) {
    const uint64_t da = Operand::descriptor(a, a_block, k0);
    wgmma_bf16<kTransA, 1, kScaleA>(acc, da, Operand::descriptor(b_hi, b_block, k0));
    wgmma_bf16<kTransA, 1, kScaleA>(acc, da, Operand::descriptor(b_lo, b_block, k0));
  }
}

// x as two bf16 pairs whose sum holds it to about 2^-17 relative: hi rounded to nearest, lo the
// rounded remainder. Products of a bf16 operand with hi and with lo, summed in fp32, are closer to
// the fp32 product than one TF32 product (2^-11).
struct SplitBf16x2 {
  uint32_t hi, lo;
};
__device__ __forceinline__ SplitBf16x2 split_bf16x2(float2 x) {
  const __nv_bfloat162 hi = __floats2bfloat162_rn(x.x, x.y);
  const float2 back = __bfloat1622float2(hi);
  const __nv_bfloat162 lo = __floats2bfloat162_rn(x.x - back.x, x.y - back.y);
  return {*reinterpret_cast<const uint32_t*>(&hi), *reinterpret_cast<const uint32_t*>(&lo)};
}

// x, two elements adjacent along MN of an MN-major B operand at byte offset `at`, split into the
// operand's hi part (from `hi`) and lo part (from `lo`).
__device__ __forceinline__ void store_split_pair(char* hi, char* lo, uint32_t at, float2 x) {
  const SplitBf16x2 parts = split_bf16x2(x);
  *reinterpret_cast<uint32_t*>(hi + at) = parts.hi;
  *reinterpret_cast<uint32_t*>(lo + at) = parts.lo;
}

}  // namespace fkt::cuda
