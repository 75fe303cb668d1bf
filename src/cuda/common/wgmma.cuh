// Warpgroup tensor-core products (sm_90a wgmma), fp32 accumulators in registers, bf16 operands: B
// (and A for SS products) read by the tensor cores from shared memory once per warpgroup of four
// warps, A for RS products from registers, where an earlier product's accumulator can feed it.
//
// PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate":
// - Shared-memory operands here are tiles of 128-byte rows under the 128-byte swizzle (the layout
//   a TMA box writes: Swizzled128). K-major: the rows run along M (or N), their bytes along K;
//   MN-major (the transposed operand, bf16 only): the rows run along K, their bytes along M (or N).
// - The accumulator of m64nNk16: warp w of the warpgroup holds rows 16w + g and 16w + g + 8
//   (g = lane / 4) at columns 8j + 2t, 8j + 2t + 1 (t = lane % 4), element 4j + i as mma.sync's
//   m16n8 element i of n-tile j (common/mma.cuh): float acc[N / 8][4].
// - Generic-proxy writes to shared memory (st.shared) reach wgmma's reads only through
//   fence.proxy.async before the barrier that publishes them; wgmma.fence orders the registers'
//   earlier writes (accumulators, RS operands) before the products, and an RS operand's registers
//   stay unchanged until the products that read them have been waited for.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "cuda/common/shared_address.cuh"

namespace fkt::cuda {

// The descriptor fields of an operand at shared address `at` (16-byte aligned): its leading and
// stride byte offsets (for the swizzled MN-major layout, between 64-element blocks along MN and
// between 8-row groups along K; for the swizzled K-major one, the leading offset is unused); the
// layout type is or-ed in by the caller.
__device__ __forceinline__ uint64_t smem_descriptor(uint32_t at, uint32_t leading, uint32_t stride) {
  return static_cast<uint64_t>((at & 0x3ffffu) >> 4) | static_cast<uint64_t>(leading >> 4) << 16 |
         static_cast<uint64_t>(stride >> 4) << 32;
}

// A B operand in tiles of [rows, 128 bytes] under the 128-byte swizzle, as a TMA box writes them
// (1024-byte aligned, the 16-byte chunk x of row r at position x ^ (r % 8)); the hardware applies
// the swizzle to the addresses it forms, so a k-step moves the start address only: plus(d, bytes)
// is the descriptor d of an operand `bytes` further (an addition to the address field, which holds
// every shared-memory address >> 4 without carry).
struct Swizzled128 {
  static constexpr uint64_t kLayout = 1ull << 62;  // the descriptor's layout type 1: 128-byte swizzle
  // K-major: the tile's rows along N (groups of 8 rows 1024 bytes apart), its bytes along K.
  __device__ static __forceinline__ uint64_t k_major(const char* tile) {
    return smem_descriptor(shared_address(tile), 16, 1024) | kLayout;
  }
  // MN-major: the tile's rows along K (groups of 8 rows 1024 bytes apart), the 64 bf16 of a row
  // along N.
  __device__ static __forceinline__ uint64_t mn_major(const char* tile) {
    return smem_descriptor(shared_address(tile), 8192, 1024) | kLayout;
  }
  __device__ static __forceinline__ uint64_t plus(uint64_t descriptor, int bytes) { return descriptor + (bytes >> 4); }
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
// hoisted out of the loop they would hold registers through it (the state passes run at the
// register cap).
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

// acc += kScaleA A B, one m64n64k16 product of bf16 operands given by their descriptors; kTransA /
// kTransB: the operand is MN-major; kScaleA: 1 or -1. The predicate p (scale-d) is true: accumulate.
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

// acc += kScaleA A B, one m64n64k16 product with A from registers (a: an a_fragment part)
// and B given by its descriptor; kTransB: B is MN-major.
template <int kScaleA, int kTransB>
__device__ __forceinline__ void wgmma_bf16_rs(float (&acc)[8][4], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, "
      "%33, %34, %35}, %36, p, %37, 1, %38;\n}\n"
      : "+f"(acc[0][0]), "+f"(acc[0][1]), "+f"(acc[0][2]), "+f"(acc[0][3]), "+f"(acc[1][0]), "+f"(acc[1][1]),
        "+f"(acc[1][2]), "+f"(acc[1][3]), "+f"(acc[2][0]), "+f"(acc[2][1]), "+f"(acc[2][2]), "+f"(acc[2][3]),
        "+f"(acc[3][0]), "+f"(acc[3][1]), "+f"(acc[3][2]), "+f"(acc[3][3]), "+f"(acc[4][0]), "+f"(acc[4][1]),
        "+f"(acc[4][2]), "+f"(acc[4][3]), "+f"(acc[5][0]), "+f"(acc[5][1]), "+f"(acc[5][2]), "+f"(acc[5][3]),
        "+f"(acc[6][0]), "+f"(acc[6][1]), "+f"(acc[6][2]), "+f"(acc[6][3]), "+f"(acc[7][0]), "+f"(acc[7][1]),
        "+f"(acc[7][2]), "+f"(acc[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(kScaleA), "n"(kTransB));
}

// TF32 products (wgmma .tf32: both shared-memory operands K-major, no transpose): the tensor cores
// read an fp32 operand's top 19 bits, a truncation, so the operands are stored rounded to TF32
// (tf32_rounded in common/mma.cuh) where they are produced. m64n128k8: acc holds the 16 n-tiles
// of 8 columns.

// The 64 accumulator registers of an m64n128 product (%0 to %63) and their operands, acc[16][4] in
// n-tile order: shared by the TF32 products below, whose operand lists differ only in A.
#define FKT_WGMMA_N128_ACC_REGS                                                                       \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                             \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                   \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                   \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define FKT_WGMMA_ACC4(acc, j) "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
#define FKT_WGMMA_N128_ACC_OPERANDS(acc)                                                                   \
  FKT_WGMMA_ACC4(acc, 0), FKT_WGMMA_ACC4(acc, 1), FKT_WGMMA_ACC4(acc, 2), FKT_WGMMA_ACC4(acc, 3),       \
      FKT_WGMMA_ACC4(acc, 4), FKT_WGMMA_ACC4(acc, 5), FKT_WGMMA_ACC4(acc, 6), FKT_WGMMA_ACC4(acc, 7),   \
      FKT_WGMMA_ACC4(acc, 8), FKT_WGMMA_ACC4(acc, 9), FKT_WGMMA_ACC4(acc, 10), FKT_WGMMA_ACC4(acc, 11), \
      FKT_WGMMA_ACC4(acc, 12), FKT_WGMMA_ACC4(acc, 13), FKT_WGMMA_ACC4(acc, 14), FKT_WGMMA_ACC4(acc, 15)

// acc += A B, one m64n128k8 product of fp32 (TF32) operands given by their descriptors.
__device__ __forceinline__ void wgmma_tf32(float (&acc)[16][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {"
      FKT_WGMMA_N128_ACC_REGS "}, %64, %65, p, 1, 1;\n}\n"
      : FKT_WGMMA_N128_ACC_OPERANDS(acc)
      : "l"(a), "l"(b));
}

// acc += A B, one m64n128k8 product with A from registers (PTX ISA, "Register fragment for matrix A",
// .tf32: a[0], a[1] hold rows g and g + 8 of the warp's 16 at column t, a[2], a[3] the same rows at
// t + 4, as mma.sync.m16n8k8 does) and B given by its descriptor.
__device__ __forceinline__ void wgmma_tf32_rs(float (&acc)[16][4], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {"
      FKT_WGMMA_N128_ACC_REGS "}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
      : FKT_WGMMA_N128_ACC_OPERANDS(acc)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// The same, m64n64k8: acc holds 8 n-tiles of 8 columns.
__device__ __forceinline__ void wgmma_tf32_rs(float (&acc)[8][4], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
      : FKT_WGMMA_ACC4(acc, 0), FKT_WGMMA_ACC4(acc, 1), FKT_WGMMA_ACC4(acc, 2), FKT_WGMMA_ACC4(acc, 3),
        FKT_WGMMA_ACC4(acc, 4), FKT_WGMMA_ACC4(acc, 5), FKT_WGMMA_ACC4(acc, 6), FKT_WGMMA_ACC4(acc, 7)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
#undef FKT_WGMMA_N128_ACC_OPERANDS
#undef FKT_WGMMA_ACC4
#undef FKT_WGMMA_N128_ACC_REGS

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

// The register A operand of the k-step over columns 16 ks .. 16 ks + 15 of an m64 accumulator, split
// in its hi and lo parts (split_bf16x2). The accumulator's layout is the A fragment's (PTX ISA,
// "Register fragment for matrix A": a0 and a1 hold rows g and g + 8 at columns 2t, 2t + 1, a2 and
// a3 the same rows at 8 + 2t, 9 + 2t), so a product's result feeds the next without shared memory.
struct SplitFragment {
  uint32_t hi[4], lo[4];
};
template <int N>
__device__ __forceinline__ SplitFragment a_fragment(const float (&acc)[N][4], int ks) {
  SplitFragment f;
#pragma unroll
  for (int x = 0; x < 4; ++x) {
    const float* pair = &acc[2 * ks + x / 2][x % 2 * 2];
    const SplitBf16x2 parts = split_bf16x2(make_float2(pair[0], pair[1]));
    f.hi[x] = parts.hi;
    f.lo[x] = parts.lo;
  }
  return f;
}

}  // namespace fkt::cuda
