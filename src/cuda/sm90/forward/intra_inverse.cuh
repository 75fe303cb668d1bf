// F3's inverse inside fwd_intra (forward/fwd_intra.cuh): T = (I + A)^-1 of a chunk, its diagonal
// 16 x 16 blocks by forward substitution, then the blocks below them.
#pragma once

#include "cuda/common/mma.cuh"
#include "cuda/common/vec4.cuh"
#include "cuda/sm90/forward/intra_tiles.cuh"

namespace fkt::cuda {

// The blocks of T = (I + A)^-1 below its diagonal, nearest the diagonal first, given its diagonal
// blocks: T_RI = -T_RR Y_RI with Y_RI = sum_{I <= M < R} A_RM T_MI (16 x 16 blocks; A, T [C, ldc],
// scratch Y of (subs - 1) 16 x 16 blocks). Each distance waits for the one before.
// kTensorCores (the kTf32 products of bfloat16 inputs): warp tasks (block, 8-column half) on tensor
// cores in split 3xTF32. Otherwise (float16 / float32 inputs): fp32 FMAs, one thread per element:
// the inverse keeps fp32 accuracy (3xTF32 drifted the float32 context-parallel gradients past
// their 1e-5 check).
template <bool kTensorCores, int kWarps>
__device__ __forceinline__ void invert_below_diagonal(const float* A, float* T, float* Y, int ldc, int subs) {
  constexpr int kSub = 16;
  const int tid = threadIdx.x, warp = tid / 32;
  for (int dist = 1; dist < subs; ++dist) {
    if constexpr (kTensorCores) {
      for (int task = warp; task < (subs - dist) * 2; task += kWarps) {
        const int R0 = (dist + task / 2) * kSub, I0 = R0 - dist * kSub, c0 = I0 + task % 2 * 8;
        float* y = Y + task * kSub * 8;  // [16, 8]: a row stride of 8 keeps the B-operand reads conflict free
        float acc[1][4] = {};
        warp_mma<Products::kSplit3, 1>(acc, I0, R0, [&](int r, int m) { return A[(R0 + r) * ldc + m]; },
                                       [&](int m, int i) { return T[m * ldc + c0 + i]; });
        for_each_acc(acc, [&](int r, int i, float x) { y[r * 8 + i] = x; });
        __syncwarp();
        float out[1][4] = {};
        warp_mma<Products::kSplit3, 1>(out, 0, kSub, [&](int r, int m) { return T[(R0 + r) * ldc + R0 + m]; },
                                       [&](int m, int i) { return y[m * 8 + i]; });
        for_each_acc(out, [&](int r, int i, float x) { T[(R0 + r) * ldc + c0 + i] = -x; });
      }
    } else {
      const int count = (subs - dist) * kSub * kSub;
      for (int x = tid; x < count; x += blockDim.x) {
        const int R0 = (dist + x / (kSub * kSub)) * kSub, I0 = R0 - dist * kSub, r = x / kSub % kSub, i = x % kSub;
        float y = 0.f;
        for (int m = I0; m < R0; ++m) y += A[(R0 + r) * ldc + m] * T[m * ldc + I0 + i];
        Y[x] = y;
      }
      __syncthreads();
      for (int x = tid; x < count; x += blockDim.x) {
        const int R0 = (dist + x / (kSub * kSub)) * kSub, I0 = R0 - dist * kSub, r = x / kSub % kSub, i = x % kSub;
        const float* y = Y + x / (kSub * kSub) * kSub * kSub;
        float v = 0.f;
        for (int m = 0; m < kSub; ++m) v -= T[(R0 + r) * ldc + R0 + m] * y[m * kSub + i];
        T[(R0 + r) * ldc + I0 + i] = v;
      }
    }
    __syncthreads();
  }
}

// T = (I + A)^-1 of the chunk's live sub-chunks in T's tile, from A's live blocks on and below the
// diagonal (A's tile): each diagonal block by forward substitution (lane i of a half-warp owns
// column i in registers), then the blocks below it (invert_below_diagonal); the blocks above the
// diagonal zero.
template <Products kP, typename In, bool kScaled>
__device__ __forceinline__ void invert(const IntraTiles<In, kScaled>& tiles, int C, int live) {
  using Config = IntraConfig<In>;
  constexpr int kSub = Config::kSub, kWarps = Config::kWarps;
  const int ldc = tiles.ldc, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* T = tiles.T;
  // The zeros above the diagonal blocks, four columns a store, by the warps that hold no diagonal
  // block (two to a warp below).
  const int solving = ceil_div(live, 2) * 32;
  for (int x = static_cast<int>(threadIdx.x) - solving; x >= 0 && x < live * kSub * (C / 4);
       x += static_cast<int>(blockDim.x) - solving) {
    const int r = x / (C / 4), i = 4 * (x % (C / 4));
    if (i >= (r / kSub + 1) * kSub) store4(T + r * ldc + i, float4{0.f, 0.f, 0.f, 0.f});
  }
  for (int b = warp * 2 + lane / kSub, i = lane % kSub; b < live; b += 2 * kWarps) {
    const float* a = tiles.A + b * kSub * (ldc + 1);
    float col[kSub];
#pragma unroll
    for (int r = 0; r < kSub; ++r) {
      float v = r == i ? 1.f : 0.f;
#pragma unroll
      for (int m = 0; m < r; ++m) v -= a[r * ldc + m] * col[m];
      col[r] = v;
    }
#pragma unroll
    for (int r = 0; r < kSub; ++r) T[(b * kSub + r) * ldc + b * kSub + i] = col[r];
  }
  __syncthreads();
  invert_below_diagonal<kP == Products::kTf32, kWarps>(tiles.A, T, tiles.Y, ldc, live);
}

}  // namespace fkt::cuda
