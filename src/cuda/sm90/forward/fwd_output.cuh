// F5 on CUDA, one block per (chunk and V-tile, value head): O = s Q_up h + tril(P) delta on tensor
// cores (common/mma.cuh), stored in q's dtype.
#pragma once

#include <type_traits>

#include "cuda/common/convert.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/mma_pairs.cuh"
#include "cuda/common/round_up.hpp"
#include "cuda/common/tile_copy.cuh"
#include "cuda/sm90/dims.hpp"
#include "cuda/sm90/forward/chunks.cuh"
#include "cuda/sm90/forward/state_rows.cuh"

namespace fkt::cuda {

struct OutputConfig {
  static constexpr int kThreads = 256;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kTileV = 64;
  static constexpr int kWarpCols = 32;  // columns of a warp's output tile (4 mma column tiles)
  __host__ __device__ static int padded(int x) { return round_up<8>(x); }
  // Row strides in elements of T, so that the fragment reads are free of bank conflicts: for fp32,
  // 4 (mod 32) for A operands (Q_up, P) and 8 (mod 32) for B operands (h, delta); for 16-bit
  // elements 8 (mod 64) for both, where lanes t, t + 1 (A) or t, t + 4 (B) share a word.
  template <typename T>
  __host__ __device__ static int ld_a(int cols) {
    return sizeof(T) == 2 ? ld_rows16(cols) : padded(cols) + 4;
  }
  static constexpr int kLdB = kTileV + 8;
  // Shared memory: Q_up [C, ld_a] of Op, h [Kp, kLdB] and P [C, ld_a] of Stored (the elements of
  // the forward's states), delta [C, kLdB] of fp32; each a multiple of 16 bytes (C is a
  // multiple of 16).
  template <typename Op, typename Stored>
  static size_t smem_bytes(int C, int K) {
    return sizeof(Op) * C * ld_a<Op>(K) + sizeof(Stored) * (padded(K) * kLdB + C * ld_a<Stored>(C)) +
           sizeof(float) * C * kLdB;
  }
};

// Stored: the element type of the states (p.ws.states_dtype) and of P's and h's tiles.
template <Products kP, typename Stored, typename Dims>
__global__ void __launch_bounds__(OutputConfig::kThreads) fwd_output_kernel(const __grid_constant__ ForwardParams p) {
  constexpr int kTile = OutputConfig::kTileV, kLdB = OutputConfig::kLdB, kCols = OutputConfig::kWarpCols;
  // The V-tiles of a chunk are adjacent in the grid: when V > 64, the second reads Q_up and P from L2.
  const int tiles = ceil_div(Dims::v(p), kTile);
  const int64_t chunk = blockIdx.x / tiles;
  const ChunkSpan c = chunk_span(p, chunk);
  const int head = blockIdx.y, e0 = static_cast<int>(blockIdx.x % tiles) * kTile;
  const int C = Dims::chunk(p), K = Dims::k(p), V = Dims::v(p), l = static_cast<int>(c.rows), width = min(kTile, V - e0);
  using Op = Operand<kP>;
  const int Kp = OutputConfig::padded(K), ldq = OutputConfig::ld_a<Op>(K), ldp = OutputConfig::ld_a<Stored>(C);
  extern __shared__ __align__(16) float smem[];
  Op* qu = reinterpret_cast<Op*>(smem);                  // [C, ldq]
  Stored* h = reinterpret_cast<Stored*>(qu + C * ldq);   // [Kp, kLdB]
  Stored* P = h + Kp * kLdB;                             // [C, ldp]
  float* delta = reinterpret_cast<float*>(P + C * ldp);  // [C, kLdB]
  const int warp = threadIdx.x / 32;
  const bool paired = pairs_aligned(p.o, p.o_dtype, V);
  auto row_at = [&](int r) { return (c.first_row + r) * p.HV + head; };

  // Rows past the chunk's end, columns past K and past the tile are zero.
  const int64_t stride_q = static_cast<int64_t>(p.HV) * K, stride_v = static_cast<int64_t>(p.HV) * V;
  copy_rows_async(qu, ldq, reinterpret_cast<const Op*>(p.ws.q_up) + row_at(0) * K, stride_q, C, Kp, l, K);
  const int64_t state = chunk * p.HV + head;
  if constexpr (std::is_same_v<Stored, float>) {
    load_state_rows(h, kLdB, p.ws, state, K, V, e0, Kp, kTile, width);
  } else {
    copy_rows_async(h, kLdB, static_cast<const Stored*>(p.ws.states) + state * K * V + e0, V, Kp, kTile, K, width);
  }
  // P holds operands (ForwardWorkspace::P_dtype): bf16 P into fp32 rows (the backward's layout,
  // keep_forward) is widened once the copies are in flight.
  const Op* const p_rows = static_cast<const Op*>(p.ws.P) + row_at(0) * C;
  const int64_t stride_p = static_cast<int64_t>(p.HV) * C;
  if constexpr (std::is_same_v<Op, Stored>) copy_rows_async(P, ldp, p_rows, stride_p, C, C, l, C);
  copy_rows_async(delta, kLdB, p.ws.delta + row_at(0) * V + e0, stride_v, C, kTile, l, width);
  cp_async_commit();
  if constexpr (!std::is_same_v<Op, Stored>) load_rows_as_float<1, Op>({{P}}, ldp, {{p_rows}}, stride_p, C, C, l, C);
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
                            [&](int d, int e) { return to_float(h[d * kLdB + c0 + e]); });
#pragma unroll
    for (int n = 0; n < kCols / 8; ++n) {
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[n][j] *= p.scale;
    }
    warp_mma<kP, kCols / 8>(acc, 0, R0 + 16, [&](int r, int i) { return to_float(P[(R0 + r) * ldp + i]); },
                            [&](int i, int e) { return delta[i * kLdB + c0 + e]; });
    for_each_acc_pair(acc, [&](int r, int e, float2 pair) {
      if (R0 + r < l && c0 + e < width) {
        store_pair(p.o, p.o_dtype, row_at(R0 + r) * V + e0 + c0 + e, pair, c0 + e + 1 < width, paired);
      }
    });
  }
}

}  // namespace fkt::cuda
