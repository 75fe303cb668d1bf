// B3 and B4 in one kernel (docs/design.md, "The floor in bytes"): a block runs B3's work on its
// chunk and value head, then B4's on the same, in the same shared memory. B4 reads back what B3
// wrote a moment before in the same block (the dq, dk, dgamma and dbeta partials, dA), which L2 still
// holds, and q, k and gamma, which B3's reads of them may have left there: the bytes between the two
// kernels' launches that DRAM no longer carries. The instance of bf16 products, a bf16 dO and
// 16-bit q and k at the common shape, with B3's products with the states on wgmma; chosen only where
// FKT_FUSED_WY_INTRA=1 (backward/launch.cu) until it has run on a GPU. Same operations in the same
// order as the two kernels: the same bits.
#pragma once

#include <cuda_bf16.h>

#include "cuda/sm90/backward/bwd_intra.cuh"
#include "cuda/sm90/backward/bwd_wy_inter.cuh"

namespace fkt::cuda {

// B4 with B3's sixteen warps, its layout from the base of the shared memory, which B3 has finished
// with at the barrier between them, below B3's mbarriers (so their memory never holds data).
using FusedIntraLayout = BwdIntraLayout<__nv_bfloat16, WyInterConfig::kThreads / 32>;
inline constexpr int kFusedC = CommonDims::chunk(ForwardParams{}), kFusedK = CommonDims::k(ForwardParams{});
inline constexpr WyInterLayout kFusedWyInter(kFusedC, kFusedK, CommonDims::v(ForwardParams{}), true);
inline constexpr int kWyIntraBytes = static_cast<int>(sizeof(float) * kFusedWyInter.floats + WyInterLayout::kAlign);
static_assert(FusedIntraLayout(kFusedC, kFusedK).bytes <= 4 * kFusedWyInter.bars, "B4's layout below B3's mbarriers");

template <bool kScaled>
__global__ void __launch_bounds__(WyInterConfig::kThreads)
    bwd_wy_intra_kernel(const __grid_constant__ WyInterParams params) {
  extern __shared__ __align__(1024) char wy_intra_smem[];
  wy_inter_block<Products::kTf32, CommonDims, __nv_bfloat16>(params, wy_intra_smem);
  __syncthreads();  // B3's shared memory is free, and its global writes are visible to the block
  intra_block<Products::kTf32, CommonDims, __nv_bfloat16, kScaled, WyInterConfig::kThreads / 32>(params.p, blockIdx.x,
                                                                                                  wy_intra_smem);
}

}  // namespace fkt::cuda
