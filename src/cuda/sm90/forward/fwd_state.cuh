// F4 on CUDA, one block per (sequence, value head, V-tile), walking the chunks in order:
// h_j = S (stored), delta = U - W S, S <- diag(exp(gamma_L)) S + K_down^T delta. S stays fp32 in
// registers (warp w holds rows 16w .. 16w + 15, mirrored to shared memory as the B operand of
// W S); both products run on tensor cores (common/mma.cuh). The next chunk's W, U are copied in
// while the state is updated, and its K_down while delta is computed (cp.async).
#pragma once

#include "cuda/common/convert.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/tile_copy.cuh"
#include "cuda/sm90/cp/params.hpp"
#include "cuda/sm90/forward/chunks.cuh"
#include "cuda/sm90/forward/state_config.hpp"

namespace fkt::cuda {

// h_j of one V-tile, from its shared-memory mirror S [Kp, kLdTile], to the workspace's states
// (fp32, [K, V] at `base`) and to intermediate_states when asked (its dtype and layout;
// [B, NT, HV, ...] with (b, j) flattening to the chunk row, so the same base).
__device__ __forceinline__ void store_state(const ForwardParams& p, const float* S, int64_t base, int e0, int width) {
  constexpr int kLd = StateConfig::kLdTile;
  store_rows(p.ws.states + base + e0, p.V, S, kLd, p.K, width);
  if (p.intermediate_states == nullptr) return;
  for_each_cell<1>(p.K, width, 0, 0, [&](int d, int e, int64_t, int) {
    const int64_t at =
        p.state_v_first ? static_cast<int64_t>(e0 + e) * p.K + d : static_cast<int64_t>(d) * p.V + e0 + e;
    store_float(p.intermediate_states, p.o_dtype, base + at, S[d * kLd + e]);
  });
}

// kSummary runs the context-parallel forward summary of sequence n instead (kda-math.md section 9):
// the same pass on the widened state [S | M] of V + K columns from [0 | I] with new values [U | 0],
// writing only the final widened state, to summary [HV, K, V + K]. Columns evolve independently,
// so the tile math is unchanged: column V + d starts at the unit vector e_d and reads no new values.
template <bool kSummary, Products kP>
__device__ __forceinline__ void fwd_state_pass(const ForwardParams& p, int64_t n, int tile, float* summary) {
  constexpr int kTile = StateConfig::kTileV, kLd = StateConfig::kLdTile;
  const int head = blockIdx.y, e0 = tile * kTile;
  const int C = p.chunk, K = p.K, V = p.V, Kp = StateConfig::padded(K);
  const int columns = kSummary ? V + K : V, width = min(kTile, columns - e0);
  const int values = kSummary ? max(0, min(kTile, V - e0)) : width;  // the tile's columns that have new values
  const int ldw = StateConfig::ld_rows(K), ldk = StateConfig::ld_transposed(K);
  const SequenceSpan seq = sequence_span(p, n);
  const FwdStateLayout L(C, K);
  extern __shared__ __align__(16) float smem[];
  float* W = smem + L.w;
  float* kd = smem + L.kd;
  float* U = smem + L.u;
  float* S = smem + L.s;
  float* delta = smem + L.delta;
  float* g_last = smem + L.g_last;
  const int warp = threadIdx.x / 32, row0 = warp * 16;
  const bool owner = row0 < Kp;
  const int64_t chunks = (seq.length + C - 1) / C, stride_k = static_cast<int64_t>(p.HV) * K;
  auto rows_of = [&](int64_t j) { return static_cast<int>(min(static_cast<int64_t>(C), seq.length - j * C)); };
  auto row_of = [&](int64_t j) { return (seq.first_row + j * C) * p.HV + head; };  // chunk's first (token, head) row
  // Group A: W and U of chunk j; group B: K_down and gamma_L. Rows past the end and padding are zero.
  auto issue_values = [&](int64_t j) {
    copy_rows_async(W, ldw, p.ws.W + row_of(j) * K, stride_k, C, Kp, rows_of(j), K);
    copy_rows_async(U, kLd, p.ws.U + row_of(j) * V + e0, static_cast<int64_t>(p.HV) * V, C, kTile, rows_of(j),
                    values);
    cp_async_commit();
  };
  auto issue_update = [&](int64_t j) {
    copy_rows_async(kd, ldk, p.ws.k_down + row_of(j) * K, stride_k, C, Kp, rows_of(j), K);
    copy_rows_async(g_last, Kp, p.ws.gamma + (row_of(j) + static_cast<int64_t>(rows_of(j) - 1) * p.HV) * K, stride_k,
                    1, Kp, 1, K);
    cp_async_commit();
  };

  float s[kTile / 8][4];
  transform_acc(s, [&](int r, int e, float) {
    const int d = row0 + r;
    if constexpr (kSummary) return owner && d < K && e < width && e0 + e == V + d ? 1.f : 0.f;
    else return p.initial_state != nullptr && owner && d < K && e < width
                    ? p.initial_state[state_index(p, n, head, d, e0 + e)]
                    : 0.f;
  });
  if (chunks > 0) {
    issue_values(0);
    issue_update(0);
  }
  for (int64_t j = 0; j < chunks; ++j) {
    const int l = rows_of(j);
    const int64_t chunk_row = seq.first_chunk + j;
    if (owner) {
      // Every reader of S waited at the previous chunk's barriers.
      for_each_acc(s, [&](int r, int e, float x) { S[(row0 + r) * kLd + e] = x; });
    }
    cp_async_wait<1>();  // group A of chunk j (group B may still be in flight)
    __syncthreads();
    // delta = U - W S: warp tiles of 16 rows x 16 columns.
    if (warp < C / 16 * 2) {
      const int R0 = warp / 2 * 16, c0 = warp % 2 * 16;
      float acc[2][4] = {};
      warp_mma<kP, 2>(acc, 0, Kp, [&](int r, int d) { return W[(R0 + r) * ldw + d]; },
                      [&](int d, int e) { return S[d * kLd + c0 + e]; });
      for_each_acc(acc, [&](int r, int e, float x) {
        const int row = R0 + r, col = c0 + e;
        delta[row * kLd + col] = row < l ? U[row * kLd + col] - x : 0.f;
      });
    }
    if (!kSummary) store_state(p, S, (chunk_row * p.HV + head) * static_cast<int64_t>(K) * V, e0, width);
    __syncthreads();  // W and U are consumed, delta is complete
    if (!kSummary) store_rows(p.ws.delta + row_of(j) * V + e0, static_cast<int64_t>(p.HV) * V, delta, kLd, l, width);
    if (j + 1 < chunks) {
      issue_values(j + 1);
      cp_async_wait<1>();  // group B of chunk j
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (owner) {
      transform_acc(s, [&](int r, int, float x) { return expf(g_last[row0 + r]) * x; });
      warp_mma<kP, kTile / 8>(s, 0, C, [&](int d, int r) { return kd[r * ldk + row0 + d]; },
                              [&](int r, int e) { return delta[r * kLd + e]; });
    }
    __syncthreads();  // K_down and gamma_L are consumed
    if (j + 1 < chunks) issue_update(j + 1);
  }
  if constexpr (kSummary) {
    if (!owner) return;
    for_each_acc(s, [&](int r, int e, float x) {
      if (row0 + r < K && e < width) summary[(static_cast<int64_t>(head) * K + row0 + r) * columns + e0 + e] = x;
    });
  } else if (p.final_state != nullptr && owner) {
    for_each_acc(s, [&](int r, int e, float x) {
      if (row0 + r < K && e < width) p.final_state[state_index(p, n, head, row0 + r, e0 + e)] = x;
    });
  }
}

// Two blocks per SM (110 KB of shared memory each for C = 64, K = 128; at most 128 registers).
template <Products kP>
__global__ void __launch_bounds__(StateConfig::kThreads, 2) fwd_state_kernel(const __grid_constant__ ForwardParams p) {
  const int tiles = StateConfig::tiles(p.V);
  fwd_state_pass<false, kP>(p, blockIdx.x / tiles, static_cast<int>(blockIdx.x % tiles), nullptr);
}

// One block per (value head, 32-column tile of V + K) of the one sequence: few blocks, so no
// register cap for two blocks per SM.
__global__ void __launch_bounds__(StateConfig::kThreads)
    cp_forward_summary_kernel(const __grid_constant__ CpForwardSummaryParams p) {
  fwd_state_pass<true, kSummaryProducts>(p.fwd, p.sequence, static_cast<int>(blockIdx.z), p.summary);
}

}  // namespace fkt::cuda
