// F5 on CUDA, one block per (chunk and V-tile, value head): O = s Q_up h + tril(P) delta on tensor
// cores (common/mma.cuh), stored in q's dtype.
#pragma once

#include "cuda/common/convert.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/mma_pairs.cuh"
#include "cuda/common/round_up.hpp"
#include "cuda/common/tile_copy.cuh"
#include "cuda/sm90/forward/chunks.cuh"

namespace fkt::cuda {

struct OutputConfig {
  static constexpr int kThreads = 256;
  static constexpr int kMinBlocks = 2;  // by shared memory (90 KB for C = 64, K = 128): 128 registers
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kTileV = 64;
  static constexpr int kWarpCols = 32;  // columns of a warp's output tile (4 mma column tiles)
  __host__ __device__ static int padded(int x) { return round_up<8>(x); }
  // Row strides: 4 (mod 32) for A operands (Q_up, P), 8 (mod 32) for B operands (h, delta), so
  // the fragment reads are free of bank conflicts.
  __host__ __device__ static int ld_a(int cols) { return padded(cols) + 4; }
  // Q_up's row stride in its elements (Operand in common/mma_pairs.cuh): as ld_a for fp32, 8
  // (mod 64) for bf16, whose lanes t, t + 1 then share a word.
  __host__ __device__ static int ld_q(int K, int operand_bytes) {
    return operand_bytes == 2 ? round_up<64>(K) + 8 : ld_a(K);
  }
  static constexpr int kLdB = kTileV + 8;
  // Shared memory: Q_up [C, ld_q] of operand_bytes each (a multiple of 16 bytes: C is a multiple of
  // 16), then fp32 h [Kp, kLdB], P [C, ld_a(C)], delta [C, kLdB].
  __host__ __device__ static int q_floats(int C, int K, int operand_bytes) {
    return C * ld_q(K, operand_bytes) * operand_bytes / 4;
  }
  static size_t smem_bytes(int C, int K, int operand_bytes) {
    return sizeof(float) * (q_floats(C, K, operand_bytes) + padded(K) * kLdB + C * ld_a(C) + C * kLdB);
  }
};

template <Products kP>
__global__ void __launch_bounds__(OutputConfig::kThreads, OutputConfig::kMinBlocks)
    fwd_output_kernel(const __grid_constant__ ForwardParams p) {
  constexpr int kTile = OutputConfig::kTileV, kLdB = OutputConfig::kLdB, kCols = OutputConfig::kWarpCols;
  // The V-tiles of a chunk are adjacent in the grid: when V > 64, the second reads Q_up and P from L2.
  const int tiles = ceil_div(p.V, kTile);
  const int64_t chunk = blockIdx.x / tiles;
  const ChunkSpan c = chunk_span(p, chunk);
  const int head = blockIdx.y, e0 = static_cast<int>(blockIdx.x % tiles) * kTile;
  const int C = p.chunk, K = p.K, V = p.V, l = static_cast<int>(c.rows), width = min(kTile, V - e0);
  using Op = Operand<kP>;
  const int Kp = OutputConfig::padded(K), ldq = OutputConfig::ld_q(K, sizeof(Op)), ldp = OutputConfig::ld_a(C);
  extern __shared__ __align__(16) float smem[];
  Op* qu = reinterpret_cast<Op*>(smem);                            // [C, ldq]
  float* h = smem + OutputConfig::q_floats(C, K, sizeof(Op));      // [Kp, kLdB]
  float* P = h + Kp * kLdB;        // [C, ldp]
  float* delta = P + C * ldp;      // [C, kLdB]
  const int warp = threadIdx.x / 32;
  const bool paired = pairs_aligned(p.o, p.o_dtype, V);
  auto row_at = [&](int r) { return (c.first_row + r) * p.HV + head; };

  // Rows past the chunk's end, columns past K and past the tile are zero.
  const int64_t stride_q = p.HV * p.ws.q_up_pitch, stride_v = static_cast<int64_t>(p.HV) * V;
  copy_rows_async(qu, ldq, reinterpret_cast<const Op*>(p.ws.q_up) + row_at(0) * p.ws.q_up_pitch, stride_q, C, Kp, l, K);
  copy_rows_async(delta, kLdB, p.ws.delta + row_at(0) * V + e0, stride_v, C, kTile, l, width);
  const int64_t state_at = (chunk * p.HV + head) * K * V + e0, p_at = row_at(0) * C, stride_c = p.HV * C;
  if (p.ws.p_states_dtype == DType::kF32) {
    copy_rows_async(h, kLdB, static_cast<const float*>(p.ws.states) + state_at, V, Kp, kTile, K, width);
    copy_rows_async(P, ldp, static_cast<const float*>(p.ws.P) + p_at, stride_c, C, C, l, C);
  } else {  // bf16: widened as loaded, while the cp.async copies are in flight
    load_rows_as_float(h, kLdB, p.ws.states, p.ws.p_states_dtype, state_at, V, Kp, kTile, K, width);
    load_rows_as_float(P, ldp, p.ws.P, p.ws.p_states_dtype, p_at, stride_c, C, C, l, C);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  // Warp tasks: (16-row tile, 32-column half of the V-tile); P is lower triangular, so row tile R
  // reads delta's rows below 16 (R + 1) only.
  constexpr int kHalves = kTile / kCols;
  for (int task = warp; task < ceil_div(l, 16) * kHalves; task += OutputConfig::kWarps) {
    const int R0 = task / kHalves * 16, c0 = task % kHalves * kCols;
    if (c0 >= width) continue;
    float acc[kCols / 8][4] = {};
    warp_mma<kP, kCols / 8>(acc, 0, Kp, [&](int r, int d) { return to_float(qu[(R0 + r) * ldq + d]); },
                            [&](int d, int e) { return h[d * kLdB + c0 + e]; });
#pragma unroll
    for (int n = 0; n < kCols / 8; ++n) {
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[n][j] *= p.scale;
    }
    warp_mma<kP, kCols / 8>(acc, 0, R0 + 16, [&](int r, int i) { return P[(R0 + r) * ldp + i]; },
                            [&](int i, int e) { return delta[i * kLdB + c0 + e]; });
    for_each_acc_pair(acc, [&](int r, int e, float2 pair) {
      if (R0 + r < l && c0 + e < width) {
        store_pair(p.o, p.o_dtype, row_at(R0 + r) * V + e0 + c0 + e, pair, c0 + e + 1 < width, paired);
      }
    });
  }
}

}  // namespace fkt::cuda
