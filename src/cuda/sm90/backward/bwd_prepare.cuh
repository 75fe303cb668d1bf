// B5 and the q/k half of B8 on CUDA, one warp per (token row, query/key head) (kda-math.md sections
// 4.5 and 4.8): sum the per-value-head dq, dk over the head's GVA group in a fixed order, then chain
// through the l2norm, dx = r (dx_hat - (dx_hat . x_hat) x_hat). The twin of src/cpu/bwd_prepare.cpp.
// Launched when either has work (a GVA group or the l2norm); otherwise bwd_intra writes dq and dk.
#pragma once

#include "cuda/common/convert.cuh"
#include "cuda/sm90/backward/params.hpp"

namespace fkt::cuda {

struct BwdPrepareConfig {
  static constexpr int kThreads = 256;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kMaxK = 128;  // each lane keeps K / 32 elements of a row in registers
  static size_t smem_bytes(int, int, int) { return 0; }
};

// Token rows b * T + t of the packed inputs: dense has N = B sequences of T tokens, varlen B = 1.
__device__ __forceinline__ int64_t token_rows(const ForwardParams& p) {
  return p.cu_seqlens == nullptr ? p.N * p.T : p.T;
}

// Grid: ceil(token_rows * H / kWarps) blocks; warp w takes row w / H, head w % H, so consecutive
// warps write consecutive rows of dq, dk.
__global__ void __launch_bounds__(BwdPrepareConfig::kThreads) bwd_prepare_kernel(const __grid_constant__ BackwardParams p) {
  constexpr int kPerLane = BwdPrepareConfig::kMaxK / 32;
  const ForwardParams& f = p.fwd;
  constexpr int kWarps = BwdPrepareConfig::kWarps;
  // Warp item = blockIdx.x * kWarps + warp. A 64-bit division is a called subroutine that spills,
  // so blockIdx.x = blocks * H + rest is split first: item / H = blocks * kWarps + s / H and
  // item % H = s % H with s = rest * kWarps + warp < H * kWarps, all 32-bit divisions.
  const uint32_t blocks = blockIdx.x / f.H, s = (blockIdx.x % f.H) * kWarps + threadIdx.x / 32;
  const int64_t row = static_cast<int64_t>(blocks) * kWarps + s / f.H;
  if (row >= token_rows(f)) return;  // the whole warp leaves together
  const int head = static_cast<int>(s % f.H), lane = threadIdx.x % 32, K = f.K, G = f.HV / f.H;
  // The row's first element in q, k, dq and dk as given: row b * T + t is b * io_T + t there (dense;
  // 32-bit division: B * T < 2^31).
  const int64_t io_token = f.io_T == f.T ? row : row + (static_cast<uint32_t>(row) / static_cast<uint32_t>(f.T)) * (f.io_T - f.T);
  const int64_t io_row = (io_token * f.io_H + head) * K;
  // dk's operands are not asked into L2 while dq is formed: that cost more than it saved (0.49 ->
  // 0.47 ms without at gva_B2_T8192_H16_HV64 on an H100, docs/design.md).
  for (int which = 0; which < 2; ++which) {
    void* out = which == 0 ? p.dq : p.dk;
    if (out == nullptr) continue;
    const float* heads = which == 0 ? p.ws.dq : p.ws.dk;
    const void* in = which == 0 ? f.q : f.k;
    // Lane holds d = lane + 32 j; lanes past K hold zeros, which add nothing to the sums below.
    float grad[kPerLane];
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int d = lane + 32 * j;
      grad[j] = 0.f;
      if (d < K) {
        for (int m = 0; m < G; ++m) grad[j] += heads[(row * f.HV + head * G + m) * K + d];
      }
    }
    if (f.l2norm) {
      // x is the raw input; the butterflies leave the same sums, bit for bit, in every lane.
      float x[kPerLane], sum = 0.f;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        const int d = lane + 32 * j;
        x[j] = d < K ? load_float(in, f.qk_dtype, io_row + d) : 0.f;
        sum += x[j] * x[j];
      }
      for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      const float rstd = 1.f / sqrtf(sum + 1e-6f);
      float dot = 0.f;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) dot += grad[j] * x[j] * rstd;
      for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) grad[j] = rstd * (grad[j] - dot * x[j] * rstd);
    }
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int d = lane + 32 * j;
      if (d < K) store_float(out, f.qk_dtype, io_row + d, grad[j]);
    }
  }
}

}  // namespace fkt::cuda
