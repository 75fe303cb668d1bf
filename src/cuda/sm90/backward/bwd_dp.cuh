// B1 on CUDA, one block per (chunk, value head): dP = s * tril(dO delta^T) (the gradient of M_qk)
// and the intra part of d_delta, P^T dO, on tensor cores (common/mma.cuh). Where B2 runs on wgmma,
// B2 and B3 form these themselves and B1 is not launched (backward/launch.cu).
#pragma once

#include "cuda/common/convert.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/mma_pairs.cuh"
#include "cuda/common/round_up.hpp"
#include "cuda/common/tile_copy.cuh"
#include "cuda/sm90/backward/params.hpp"
#include "cuda/sm90/dims.hpp"
#include "cuda/sm90/forward/chunks.cuh"

namespace fkt::cuda {

struct DpConfig {
  static constexpr int kThreads = 256;
  static constexpr int kWarps = kThreads / 32;
  __host__ __device__ static int padded(int x) { return round_up<8>(x); }
  // Row strides 4 (mod 32) for fp32 rows read as mma (row g, column t) fragments, P's 8 (mod 32)
  // for its transposed reads; 16-bit dO rows 8 (mod 64), where two lanes read one word.
  __host__ __device__ static int ld_v(int V) { return padded(V) + 4; }
  __host__ __device__ static int ld_p(int C) { return C + 8; }
  template <typename DoT>
  __host__ __device__ static int ld_o(int V) {
    return sizeof(DoT) == 2 ? ld_rows16(V) : ld_v(V);
  }
  // Shared memory: dO [C, ld_o] of DoT (a multiple of 16 bytes: C is a multiple of 16), then fp32
  // delta [C, ld_v] (for dP) and P [C, ld_p] (for the intra part).
  template <typename DoT>
  __host__ __device__ static int d_o_floats(int C, int V) {
    return C * ld_o<DoT>(V) * static_cast<int>(sizeof(DoT)) / 4;
  }
  template <typename DoT>
  static size_t smem_bytes(int C, int V) {
    return sizeof(float) * (d_o_floats<DoT>(C, V) + C * ld_v(V) + C * ld_p(C));
  }
};

// DoT: dO in shared memory, 16-bit as given (with_d_o_storage) or widened to fp32.
template <Products kP, typename Dims, typename DoT>
__global__ void __launch_bounds__(DpConfig::kThreads) bwd_dp_kernel(const __grid_constant__ BackwardParams p) {
  const ForwardParams& f = p.fwd;
  const ChunkSpan c = chunk_span(f, blockIdx.x);
  const int head = blockIdx.y, C = Dims::chunk(f), V = Dims::v(f), l = static_cast<int>(c.rows);
  const int Vp = DpConfig::padded(V), ldv = DpConfig::ld_v(V), ldp = DpConfig::ld_p(C);
  const int ldo = DpConfig::ld_o<DoT>(V);
  extern __shared__ __align__(16) float smem[];
  DoT* d_o = reinterpret_cast<DoT*>(smem);                // [C, ldo]
  float* delta = smem + DpConfig::d_o_floats<DoT>(C, V);  // [C, ldv]
  float* P = delta + C * ldv;                             // [C, ldp]
  const int warp = threadIdx.x / 32;
  auto row_at = [&](int r) { return (c.first_row + r) * f.HV + head; };
  auto io_at = [&](int r) { return (c.io_row + r) * f.io_HV + head; };  // the same in dO and P
  const int64_t io_first = io_at(0) * V, io_v = static_cast<int64_t>(f.io_HV) * V;  // dO
  // Rows past the chunk's end and columns past V are zero.
  const int64_t stride_v = static_cast<int64_t>(f.HV) * V;
  copy_rows_async(delta, ldv, f.ws.delta + row_at(0) * V, stride_v, C, Vp, l, V);
  if constexpr (sizeof(DoT) == 2) {
    copy_rows16_async(d_o, ldo, static_cast<const DoT*>(p.d_o) + io_first, io_v, C, Vp, l, V);
  }
  // P by rows of the inputs as given, in the operands' type (ForwardWorkspace::P): fp32 copied,
  // bf16 widened once the copies are in flight.
  using Op = Operand<kP>;
  const Op* const p_rows = static_cast<const Op*>(f.ws.P) + io_at(0) * C;
  const int64_t p_stride = static_cast<int64_t>(f.io_HV) * C;
  if constexpr (sizeof(Op) == 4) copy_rows_async(P, ldp, p_rows, p_stride, C, C, l, C);
  cp_async_commit();
  if constexpr (sizeof(Op) == 2) load_rows_as_float<1, Op>({{P}}, ldp, {{p_rows}}, p_stride, C, C, l, C);
  if constexpr (sizeof(DoT) == 4) load_rows_as_float(d_o, ldo, p.d_o, p.d_o_dtype, io_first, io_v, C, Vp, l, V);
  cp_async_wait<0>();
  __syncthreads();
  // dP: warp tiles of 16 rows x 32 columns; row tile R needs columns below 16 (R + 1) only.
  for (int task = warp; task < C / 16 * (C / 32); task += DpConfig::kWarps) {
    const int R0 = task / (C / 32) * 16, c0 = task % (C / 32) * 32;
    float acc[4][4] = {};
    if (c0 < R0 + 16) {
      warp_mma<kP, 4>(acc, 0, Vp, [&](int r, int e) { return to_float(d_o[(R0 + r) * ldo + e]); },
                      [&](int e, int i) { return delta[(c0 + i) * ldv + e]; });
    }
    for_each_acc(acc, [&](int r, int i, float x) {
      const int row = R0 + r, col = c0 + i;
      if (row < l) p.ws.dP[row_at(row) * C + col] = col <= row ? f.scale * x : 0.f;
    });
  }
  // P^T dO: warp tiles of 16 rows x 64 columns; row tile I reads P's rows r >= I (lower triangular).
  const int halves = ceil_div(Vp, 64);
  for (int task = warp; task < C / 16 * halves; task += DpConfig::kWarps) {
    const int I0 = task / halves * 16, c0 = task % halves * 64;
    float acc[8][4] = {};
    warp_mma<kP, 8>(acc, I0, C, [&](int i, int r) { return P[r * ldp + I0 + i]; },
                    [&](int r, int e) { return c0 + e < Vp ? to_float(d_o[r * ldo + c0 + e]) : 0.f; });
    for_each_acc(acc, [&](int i, int e, float x) {
      const int row = I0 + i, col = c0 + e;
      if (row < l && col < V) p.ws.d_delta[row_at(row) * V + col] = x;
    });
  }
}

}  // namespace fkt::cuda
