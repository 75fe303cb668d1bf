// Tensor-memory-accelerator copies (sm_90) into shared memory, completing on an mbarrier: one
// thread issues a whole tile, where cp.async takes an instruction and its address arithmetic per
// 16 bytes and thread (the wgmma state passes' copies: 28 cp.async a thread and chunk step, their
// address registers spilled).
//
// PTX ISA, "cp.async.bulk.tensor" and "mbarrier": a copy adds its bytes to the barrier's
// transaction count as they land; the barrier's phase completes once its expected bytes (set by
// mbarrier.arrive.expect_tx, which is also its one arrival) have landed, and a thread that sees
// the phase complete (try_wait.parity) sees the tile. Boxes outside the tensor are zero-filled.
#pragma once

#include <cstdint>

#include <cuda.h>

#include "cuda/common/shared_address.cuh"

namespace fkt::cuda {

// A barrier for one arrival, its initialisation published to the block's other threads and to the
// async proxy (a __syncthreads must follow before they use it).
__device__ __forceinline__ void mbarrier_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(shared_address(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// The barrier's one arrival, expecting `bytes` of copies in its current phase.
__device__ __forceinline__ void mbarrier_expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(bar)), "r"(bytes)
               : "memory");
}

// Waits until the barrier's phase of parity `parity` has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait;\n}\n" ::"r"(shared_address(bar)),
      "r"(parity)
      : "memory");
}

// The box of a 3-d tensor map at coordinates (c0, c1, c2), innermost first, into shared memory at
// dst (aligned as the map's swizzle requires: 1024 bytes for 128-byte swizzle).
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap& map, uint64_t* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];\n" ::"r"(shared_address(dst)),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(shared_address(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// `bytes` contiguous bytes (a multiple of 16, both addresses 16-byte aligned) into shared memory.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          shared_address(dst)),
      "l"(src), "r"(bytes), "r"(shared_address(bar))
      : "memory");
}

// Zeroes rows [first, kRows) of `boxes` consecutive boxes of kRows rows x 128 bytes (by the whole
// block of kThreads): rows that a box read past a sequence's end, from the next sequence, where a
// product would multiply them (the swizzle permutes bytes within a row only). The wgmma products
// read them after fence_proxy_async_shared and a barrier.
template <int kThreads, int kRows>
__device__ __forceinline__ void zero_box_rows(char* tile, int boxes, int first) {
  const int cells = (kRows - first) * 8;
  for (int x = static_cast<int>(threadIdx.x); x < boxes * cells; x += kThreads) {
    *reinterpret_cast<uint4*>(tile + x / cells * kRows * 128 + first * 128 + x % cells * 16) = make_uint4(0, 0, 0, 0);
  }
}

}  // namespace fkt::cuda
