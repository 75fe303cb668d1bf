// B2 on CUDA, one block per (sequence, value head, V-tile), walking the chunks in reverse.
// dS is the gradient of the state leaving the chunk: it is stored, d_delta += K_down dS, and
// dS <- diag(exp(gamma_L)) dS + s Q_up^T dO - W^T d_delta. dS stays fp32 in registers (warp w
// holds rows 16 (w % 8) .. + 15, interleaved as the accumulator of Q_up^T dO, and 16 of the
// tile's columns, or all 32 in a block of 8 warps: StateConfig), mirrored transposed to shared
// memory as the B operand of K_down dS; d_delta then goes transposed into the mirror's room, so
// that the operands are read in pairs (common/mma_pairs.cuh). The products run on tensor cores and
// the previous chunk's operands are copied in meanwhile, as in fwd_state.
#pragma once

#include "cuda/common/convert.cuh"
#include "cuda/common/mma_pairs.cuh"
#include "cuda/common/round_up.hpp"
#include "cuda/common/tile_copy.cuh"
#include "cuda/sm90/backward/params.hpp"
#include "cuda/sm90/cp/params.hpp"
#include "cuda/sm90/dims.hpp"
#include "cuda/sm90/forward/chunks.cuh"
#include "cuda/sm90/forward/state_config.hpp"

namespace fkt::cuda {

// kSummary runs the context-parallel backward summary of sequence n instead (kda-math.md section 9):
// the same pass on the widened gradient [dS | dM] of V + K columns from [0 | I] with upstream
// [dO | 0] and intra d_delta [P^T dO | 0] (B1 run on zero new values), writing only the widened
// gradient entering the sequence, to summary [HV, K, V + K]. Columns evolve independently: column
// V + d starts at the unit vector e_d and reads no dO and no intra d_delta.
// DoT: dO in shared memory, 16-bit as given (with_d_o_storage: copied with cp.async, exact
// operands) or fp32 (loaded through registers, stored as operands); s is applied to Q_up^T dO.
template <bool kSummary, Products kP, int kThreads, typename Dims, typename DoT>
__device__ __forceinline__ void bwd_state_pass(const BackwardParams& p, int64_t n, int tile, float* summary) {
  constexpr int kTile = StateConfig::kTileV;
  constexpr int kCols = StateConfig::warp_cols(kThreads);
  constexpr bool kDo16 = sizeof(DoT) == 2;
  constexpr int kPrefetch = kDo16 ? 1 : 64 * kTile / kThreads;  // fp32 dO elements a thread carries (C <= 64)
  const ForwardParams& f = p.fwd;
  const int head = blockIdx.y, e0 = tile * kTile;
  const int C = Dims::chunk(f), K = Dims::k(f), V = Dims::v(f), Kp = StateConfig::padded(K);
  const int columns = kSummary ? V + K : V, width = min(kTile, columns - e0);
  const int values = kSummary ? max(0, min(kTile, V - e0)) : width;  // the tile's columns with dO, d_delta
  using Op = Operand<kP>;
  const int ldr = StateConfig::ld_operand(K, sizeof(Op), true), ldm = StateConfig::ld_operand(K, sizeof(Op), false);
  const int ldk = StateConfig::ld_k_rows(K), ldd = StateConfig::ld_k_rows(C);
  const int ldo = BwdStateLayout::ld_d_o(sizeof(DoT));
  const SequenceSpan seq = sequence_span(f, n);
  const BwdStateLayout L(C, K, sizeof(Op), sizeof(DoT));
  extern __shared__ __align__(16) float smem[];
  Op* kd = reinterpret_cast<Op*>(smem + L.kd);
  float* dS_t = smem + L.ds;
  float* dd_t = smem + L.ds;  // once K_down dS has read dS^T
  Op* qu = reinterpret_cast<Op*>(smem + L.qu);
  Op* W = reinterpret_cast<Op*>(smem + L.w);
  DoT* d_o = reinterpret_cast<DoT*>(smem + L.d_o);
  float* g_last = smem + L.g_last;
  const int tid = threadIdx.x, warp = tid / 32, row0 = warp % StateConfig::kWarps * 16;
  const int col0 = warp / StateConfig::kWarps * kCols;  // the warp's first column of dS
  const bool owner = row0 < Kp;
  const int64_t chunks = ceil_div(seq.length, C), stride_k = static_cast<int64_t>(f.HV) * K;
  auto rows_of = [&](int64_t j) { return static_cast<int>(min(static_cast<int64_t>(C), seq.length - j * C)); };
  auto row_of = [&](int64_t j) { return (seq.first_row + j * C) * f.HV + head; };  // chunk's first (token, head) row
  auto io_row_of = [&](int64_t j) { return (seq.io_row + j * C) * f.io_HV + head; };  // the same in dO
  const int64_t io_v = static_cast<int64_t>(f.io_HV) * V;
  // Group A: K_down of chunk j; group B: Q_up, W, gamma_L and a 16-bit dO. Rows past the end and
  // padding are zero.
  auto issue_delta = [&](int64_t j) {
    copy_rows_async(kd, ldr, reinterpret_cast<const Op*>(f.ws.k_down) + row_of(j) * K, stride_k, C, Kp, rows_of(j),
                    K);
    cp_async_commit();
  };
  auto issue_update = [&](int64_t j) {
    copy_rows_async(qu, ldm, reinterpret_cast<const Op*>(f.ws.q_up) + row_of(j) * K, stride_k, C, Kp, rows_of(j), K);
    copy_rows_async(W, ldm, reinterpret_cast<const Op*>(f.ws.W) + row_of(j) * K, stride_k, C, Kp, rows_of(j), K);
    copy_rows_async(g_last, Kp, f.ws.g_last + ((seq.first_chunk + j) * f.HV + head) * K, K, 1, Kp, 1, K);
    if constexpr (kDo16) {
      copy_rows16_async(d_o, ldo, static_cast<const DoT*>(p.d_o) + io_row_of(j) * V + e0, io_v, C, kTile,
                        rows_of(j), values);
    }
    cp_async_commit();
  };

  float ds[kCols / 8][4];  // interleaved rows: acc_row<true>
  transform_acc<true>(ds, [&](int r, int col, float) {
    const int d = row0 + r, e = col0 + col;
    if constexpr (kSummary) return owner && d < K && e < width && e0 + e == V + d ? 1.f : 0.f;
    else return p.d_final_state != nullptr && owner && d < K && e < width
                    ? p.d_final_state[state_index(f, n, head, d, e0 + e)]
                    : 0.f;
  });
  if (chunks > 0) {
    issue_delta(chunks - 1);
    issue_update(chunks - 1);
  }
  const bool states_paired = pairs_aligned(p.ws.d_states, DType::kF32, V);
  const bool delta_paired = pairs_aligned(p.ws.d_delta, DType::kF32, V);
  // d_delta = intra part + K_down dS: warp tiles of 16 rows x 16 columns, C / 16 * 2 of them.
  const bool delta_warp = warp < C / 16 * 2;
  const int R0 = warp / 2 * 16, c0 = warp % 2 * 16;
  for (int64_t j = chunks - 1; j >= 0; --j) {
    const int l = rows_of(j);
    const int64_t chunk_row = seq.first_chunk + j;
    if (owner) {
      // The mirror (every reader of it waited at the later chunk's barriers) and the stores.
      const int64_t base = (chunk_row * f.HV + head) * static_cast<int64_t>(K) * V + e0;
      for_each_acc_pair<true>(ds, [&](int r, int col, float2 x) {
        const int d = row0 + r, e = col0 + col;
        store_transposed_pair<kP>(dS_t, ldk, d, e, x);
        if (!kSummary && d < K && e < width) {
          store_pair(p.ws.d_states, DType::kF32, base + static_cast<int64_t>(d) * V + e, x, e + 1 < width,
                     states_paired);
        }
      });
    }
    // The accumulator starts from the intra part (B1), loaded while the copies land.
    float dd[2][4];
    transform_acc(dd, [&](int r, int col, float) {
      const int row = R0 + r, e = c0 + col;
      const int64_t at = (row_of(j) + static_cast<int64_t>(row) * f.HV) * V + e0 + e;
      return delta_warp && row < l && e < values ? p.ws.d_delta[at] : 0.f;
    });
    float pre[kPrefetch];  // fp32 dO of this chunk, loaded while d_delta is computed
    if constexpr (!kDo16) {
#pragma unroll
      for (int i = 0; i < kPrefetch; ++i) {
        const int x = tid + i * kThreads, r = x / kTile, e = x % kTile;
        const int64_t at = (io_row_of(j) + static_cast<int64_t>(r) * f.io_HV) * V + e0 + e;
        pre[i] = r < l && e < values ? load_float(p.d_o, p.d_o_dtype, at) : 0.f;
      }
    }
    cp_async_wait<1>();  // group A of chunk j (group B may still be in flight)
    __syncthreads();
    if (delta_warp) {
      mma_steps<kP>(
          dd, 0, Kp, [&](int k) { return frag_a_k_rows<kP>(kd + R0 * ldr, ldr, k); },
          [&](int k, int n) { return frag_b_k_rows<kP>(dS_t + (c0 + 8 * n) * ldk, ldk, k); });
      if (!kSummary) {
        for_each_acc_pair(dd, [&](int r, int e, float2 x) {
          const int row = R0 + r, col = c0 + e;
          if (row < l && col < width) {
            store_pair(p.ws.d_delta, DType::kF32, (row_of(j) + static_cast<int64_t>(row) * f.HV) * V + e0 + col, x,
                       col + 1 < width, delta_paired);
          }
        });
      }
    }
    if constexpr (!kDo16) {
#pragma unroll
      for (int i = 0; i < kPrefetch; ++i) {
        const int x = tid + i * kThreads;
        if (x < C * kTile) d_o[x / kTile * ldo + x % kTile] = as_operand<kP>(pre[i]);
      }
    }
    cp_async_wait<0>();  // group B of chunk j
    __syncthreads();     // K_down and dS^T are consumed; dO, Q_up, W are in
    if (j > 0) issue_delta(j - 1);
    if (delta_warp) {
      for_each_acc_pair(dd, [&](int r, int e, float2 x) { store_transposed_pair<kP>(dd_t, ldd, R0 + r, c0 + e, x); });
    }
    __syncthreads();  // d_delta^T is in
    if (owner) {
      // dS <- exp(gamma_L) dS - W^T d_delta + s Q_up^T dO, the products from zero.
      float prod[kCols / 8][4] = {};
      mma_steps<kP>(
          prod, 0, C, [&](int k) { return frag_a_m_rows<kP>(W + row0, ldm, k); },
          [&](int k, int n) { return frag_b_k_rows<kP>(dd_t + (col0 + 8 * n) * ldd, ldd, k); });
      transform_acc<true>(ds, [&](int r, int, float x) { return expf(g_last[row0 + r]) * x; });
#pragma unroll
      for (int t = 0; t < kCols / 8; ++t) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          ds[t][i] -= prod[t][i];
          prod[t][i] = 0.f;
        }
      }
      mma_steps<kP>(
          prod, 0, C, [&](int k) { return frag_a_m_rows<kP>(qu + row0, ldm, k); },
          [&](int k, int n) { return frag_b_n_rows<kP>(d_o + col0 + 8 * n, ldo, k); });
#pragma unroll
      for (int t = 0; t < kCols / 8; ++t) {
#pragma unroll
        for (int i = 0; i < 4; ++i) ds[t][i] += f.scale * prod[t][i];
      }
    }
    __syncthreads();  // Q_up, W, gamma_L, d_delta^T and dO are consumed
    if (j > 0) issue_update(j - 1);
  }
  if constexpr (kSummary) {
    if (!owner) return;
    for_each_acc<true>(ds, [&](int r, int col, float x) {
      const int e = col0 + col;
      if (row0 + r < K && e < width) summary[(static_cast<int64_t>(head) * K + row0 + r) * columns + e0 + e] = x;
    });
  } else if (p.dh0 != nullptr && owner) {
    for_each_acc<true>(ds, [&](int r, int col, float x) {
      const int e = col0 + col;
      if (row0 + r < K && e < width) p.dh0[state_index(f, n, head, row0 + r, e0 + e)] = x;
    });
  }
}

// 73.5 KB of shared memory for C = 64, K = 128, bf16 operands and dO: up to three blocks per SM
// (R: with_state_residency).
template <Products kP, typename R, typename Dims, typename DoT>
__global__ void __launch_bounds__(R::threads, R::blocks_per_sm)
    bwd_state_kernel(const __grid_constant__ BackwardParams p) {
  const int tiles = StateConfig::tiles(Dims::v(p.fwd));
  bwd_state_pass<false, kP, R::threads, Dims, DoT>(p, blockIdx.x / tiles, static_cast<int>(blockIdx.x % tiles),
                                                   nullptr);
}

// One block per (value head, 32-column tile of V + K) of the one sequence.
__global__ void __launch_bounds__(2 * StateConfig::kThreads, 1)
    cp_backward_summary_kernel(const __grid_constant__ CpBackwardSummaryParams p) {
  bwd_state_pass<true, kSummaryProducts, 2 * StateConfig::kThreads, RuntimeDims, float>(
      p.bwd, p.sequence, static_cast<int>(blockIdx.z), p.summary);
}

}  // namespace fkt::cuda
