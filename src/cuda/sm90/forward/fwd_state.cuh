// F4 on CUDA, one block per (sequence, value head, V-tile), walking the chunks in order:
// h_j = S (stored), delta = U - W S, S <- diag(exp(gamma_L)) S + K_down^T delta. S stays fp32 in
// registers (warp w holds rows 16 (w % 8) .. + 15, interleaved as the accumulator of K_down^T
// delta, and the tile's 32 columns, or 16 of them in a block of 16 warps: StateConfig), mirrored
// transposed to shared memory as the B operand of W S; delta goes to shared memory transposed too,
// so that every operand is read in pairs (common/mma_pairs.cuh). The next chunk's W, U are copied
// in while the state is updated, and its K_down while delta is computed (cp.async).
#pragma once

#include "cuda/common/convert.cuh"
#include "cuda/common/mma_pairs.cuh"
#include "cuda/common/round_up.hpp"
#include "cuda/common/tile_copy.cuh"
#include "cuda/sm90/cp/params.hpp"
#include "cuda/sm90/dims.hpp"
#include "cuda/sm90/forward/chunks.cuh"
#include "cuda/sm90/forward/intermediate_states.cuh"
#include "cuda/sm90/forward/state_config.hpp"

namespace fkt::cuda {

// kSummary runs the context-parallel forward summary of sequence n instead (kda-math.md section 9):
// the same pass on the widened state [S | M] of V + K columns from [0 | I] with new values [U | 0],
// writing only the final widened state, to summary [HV, K, V + K]. Columns evolve independently,
// so the tile math is unchanged: column V + d starts at the unit vector e_d and reads no new values.
template <bool kSummary, Products kP, int kThreads, typename Dims>
__device__ __forceinline__ void fwd_state_pass(const ForwardParams& p, int64_t n, int tile, float* summary) {
  constexpr int kTile = StateConfig::kTileV, kLd = StateConfig::kLdTile, kCols = StateConfig::warp_cols(kThreads);
  const int head = blockIdx.y, e0 = tile * kTile;
  const int C = Dims::chunk(p), K = Dims::k(p), V = Dims::v(p), Kp = StateConfig::padded(K);
  const int columns = kSummary ? V + K : V, width = min(kTile, columns - e0);
  const int values = kSummary ? max(0, min(kTile, V - e0)) : width;  // the tile's columns that have new values
  using Op = Operand<kP>;
  const int ldw = StateConfig::ld_operand(K, sizeof(Op), true), ldm = StateConfig::ld_operand(K, sizeof(Op), false);
  const int ldk = StateConfig::ld_k_rows(K), ldd = StateConfig::ld_k_rows(C);
  const SequenceSpan seq = sequence_span(p, n);
  const FwdStateLayout L(C, K, sizeof(Op));
  extern __shared__ __align__(16) float smem[];
  Op* W = reinterpret_cast<Op*>(smem + L.w);
  Op* kd = reinterpret_cast<Op*>(smem + L.kd);
  float* U = smem + L.u;
  float* S_t = smem + L.s;
  float* delta_t = smem + L.delta;
  float* g_last = smem + L.g_last;
  const int warp = threadIdx.x / 32, row0 = warp % StateConfig::kWarps * 16;
  const int col0 = warp / StateConfig::kWarps * kCols;  // the warp's first column of S
  const bool owner = row0 < Kp;
  const int64_t chunks = ceil_div(seq.length, C), stride_k = static_cast<int64_t>(p.HV) * K;
  const int64_t stride_v = static_cast<int64_t>(p.HV) * V;
  auto rows_of = [&](int64_t j) { return static_cast<int>(min(static_cast<int64_t>(C), seq.length - j * C)); };
  auto row_of = [&](int64_t j) { return (seq.first_row + j * C) * p.HV + head; };  // chunk's first (token, head) row
  // Group A: W and U of chunk j; group B: K_down and gamma_L. Rows past the end and padding are zero.
  auto issue_values = [&](int64_t j) {
    copy_rows_async(W, ldw, reinterpret_cast<const Op*>(p.ws.W) + row_of(j) * K, stride_k, C, Kp, rows_of(j), K);
    copy_rows_async(U, kLd, p.ws.U + row_of(j) * V + e0, stride_v, C, kTile, rows_of(j), values);
    cp_async_commit();
  };
  auto issue_update = [&](int64_t j) {
    copy_rows_async(kd, ldm, reinterpret_cast<const Op*>(p.ws.k_down) + row_of(j) * K, stride_k, C, Kp, rows_of(j),
                    K);
    copy_rows_async(g_last, Kp, p.ws.g_last + ((seq.first_chunk + j) * p.HV + head) * K, K, 1, Kp, 1, K);
    cp_async_commit();
  };

  float s[kCols / 8][4];  // interleaved rows: acc_row<true>
  transform_acc<true>(s, [&](int r, int col, float) {
    const int d = row0 + r, e = col0 + col;
    if constexpr (kSummary) return owner && d < K && e < width && e0 + e == V + d ? 1.f : 0.f;
    else return p.initial_state != nullptr && owner && d < K && e < width
                    ? p.initial_state[state_index(p, n, head, d, e0 + e)]
                    : 0.f;
  });
  if (chunks > 0) {
    issue_values(0);
    issue_update(0);
  }
  const DType states_dtype = p.ws.states_dtype;
  const bool states_paired = pairs_aligned(p.ws.states, states_dtype, V);
  const bool delta_paired = pairs_aligned(p.ws.delta, DType::kF32, V);
  // The state into a tensor like the initial state (a time segment's start, or the final state).
  auto store_state = [&](float* to) {
    for_each_acc<true>(s, [&](int r, int col, float x) {
      const int e = col0 + col;
      if (row0 + r < K && e < width) to[state_index(p, n, head, row0 + r, e0 + e)] = x;
    });
  };
  int64_t segment_start = first_segment_start(p, 0);
  for (int64_t j = 0; j < chunks; ++j) {
    const int l = rows_of(j);
    const int64_t chunk_row = seq.first_chunk + j;
    if (!kSummary && j == segment_start) {
      if (owner) store_state(segment_states_at(p, j));
      segment_start += p.segment_chunks;
    }
    if (owner) {
      // h_j: the mirror (every reader of it waited at the previous chunk's barriers) and the stores;
      // intermediate_states is [B, NT, HV, ...] with (b, j) flattening to the chunk row, as the states.
      const int64_t base = (chunk_row * p.HV + head) * static_cast<int64_t>(K) * V;
      for_each_acc_pair<true>(s, [&](int r, int col, float2 x) {
        const int d = row0 + r, e = col0 + col;
        store_transposed_pair<kP>(S_t, ldk, d, e, x);
        if (kSummary || d >= K || e >= width) return;
        store_pair(p.ws.states, states_dtype, base + static_cast<int64_t>(d) * V + e0 + e, x, e + 1 < width,
                   states_paired);
        if (p.intermediate_states == nullptr) return;
        for (int i = 0; i < 2 && e + i < width; ++i) {
          const int64_t at = p.state_v_first ? static_cast<int64_t>(e0 + e + i) * K + d
                                             : static_cast<int64_t>(d) * V + e0 + e + i;
          store_float(p.intermediate_states, p.o_dtype, base + at, i == 0 ? x.x : x.y);
        }
      });
    }
    cp_async_wait<1>();  // group A of chunk j (group B may still be in flight)
    __syncthreads();
    // delta = U - W S: warp tiles of 16 rows x 16 columns.
    if (warp < C / 16 * 2) {
      const int R0 = warp / 2 * 16, c0 = warp % 2 * 16;
      float acc[2][4] = {};
      mma_steps<kP>(
          acc, 0, Kp, [&](int k) { return frag_a_k_rows<kP>(W + R0 * ldw, ldw, k); },
          [&](int k, int n) { return frag_b_k_rows<kP>(S_t + (c0 + 8 * n) * ldk, ldk, k); });
      for_each_acc_pair(acc, [&](int r, int e, float2 x) {
        const int row = R0 + r, col = c0 + e;
        const float2 u = load2(U + row * kLd + col);
        const float2 d = row < l ? make_float2(u.x - x.x, u.y - x.y) : make_float2(0.f, 0.f);
        store_transposed_pair<kP>(delta_t, ldd, row, col, d);
        if (!kSummary && row < l && col < width) {
          store_pair(p.ws.delta, DType::kF32, (row_of(j) + static_cast<int64_t>(row) * p.HV) * V + e0 + col, d,
                     col + 1 < width, delta_paired);
        }
      });
    }
    cp_async_wait<0>();  // group B of chunk j
    __syncthreads();     // W, U and S^T are consumed; delta^T, K_down and gamma_L are in
    if (j + 1 < chunks) issue_values(j + 1);
    if (owner) {
      transform_acc<true>(s, [&](int r, int, float x) { return expf(g_last[row0 + r]) * x; });
      mma_steps<kP>(
          s, 0, C, [&](int k) { return frag_a_m_rows<kP>(kd + row0, ldm, k); },
          [&](int k, int n) { return frag_b_k_rows<kP>(delta_t + (col0 + 8 * n) * ldd, ldd, k); });
    }
    __syncthreads();  // K_down, gamma_L and delta^T are consumed
    if (j + 1 < chunks) issue_update(j + 1);
  }
  if constexpr (kSummary) {
    if (!owner) return;
    for_each_acc<true>(s, [&](int r, int col, float x) {
      const int e = col0 + col;
      if (row0 + r < K && e < width) summary[(static_cast<int64_t>(head) * K + row0 + r) * columns + e0 + e] = x;
    });
  } else if (p.final_state != nullptr && owner) {
    store_state(p.final_state);
  }
}

// 106 KB of shared memory for C = 64, K = 128 and fp32 operands, 72 KB with bf16 ones: up to two
// blocks per SM, three with bf16 operands (R: with_state_residency).
template <Products kP, typename R, typename Dims>
__global__ void __launch_bounds__(R::threads, R::blocks_per_sm)
    fwd_state_kernel(const __grid_constant__ ForwardParams p) {
  const int tiles = StateConfig::tiles(Dims::v(p));
  fwd_state_pass<false, kP, R::threads, Dims>(p, blockIdx.x / tiles, static_cast<int>(blockIdx.x % tiles), nullptr);
}

// One block per (value head, 32-column tile of V + K) of the one sequence: few blocks, so no
// register cap for two blocks per SM.
__global__ void __launch_bounds__(StateConfig::kThreads)
    cp_forward_summary_kernel(const __grid_constant__ CpForwardSummaryParams p) {
  fwd_state_pass<true, kSummaryProducts, StateConfig::kThreads, RuntimeDims>(p.fwd, p.sequence,
                                                                              static_cast<int>(blockIdx.z), p.summary);
}

}  // namespace fkt::cuda
