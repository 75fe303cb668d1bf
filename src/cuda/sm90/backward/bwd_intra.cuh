// B4 on CUDA, one block per (chunk, value head): the gradients through P = s M_qk and
// A = diag(beta) M_kk (kda-math.md section 4.4), added in place to B3's dq, dk, dgamma and dbeta
// (dq and dk stored as the final gradients when nothing is left for bwd_prepare: qk_in_intra).
// Rows sum over their columns (dq_rows, dk_rows), columns over their rows (dk_cols); dgamma gets +
// on the row side and - on the column side of every exp(gamma_r - gamma_i).
// A task is a 16-row sub-chunk x 32 columns of K, one warp's. The terms between sub-chunks are
// tensor-core products with a reference row between the two (kda-math.md 3.4; every factor
// exp(later - earlier) <= 1): row side at the sub-chunk's first row, column side at its last. The
// terms inside the sub-chunk keep the pairwise exponentials.
#pragma once

#include "cuda/common/convert.cuh"
#include "cuda/common/fast_exp.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/narrow_block.hpp"
#include "cuda/common/round_up.hpp"
#include "cuda/common/tile_copy.cuh"
#include "cuda/sm90/backward/handoffs.cuh"
#include "cuda/sm90/backward/params.hpp"
#include "cuda/sm90/dims.hpp"
#include "cuda/sm90/forward/chunks.cuh"

namespace fkt::cuda {

// Qk: how q and k sit in shared memory: 16-bit inputs as given, exactly (q_hat and k_hat are formed
// where read), which with dP and dA in one array lets two blocks share an SM; fp32 widened.
template <typename Qk>
struct BwdIntraConfig : NarrowBlock<Qk> {
  using NarrowBlock<Qk>::kNarrow;
  static constexpr int kMinBlocks = kNarrow ? 2 : 1;
  static constexpr int kCols = 32;  // columns of K per warp
  static constexpr int kLdScratch = kCols + 4;
  __host__ __device__ static int padded(int x) { return round_up<32>(x); }
};

// Shared memory, offsets in bytes. Row strides: 4 words (mod 32) for q, k and gamma (read as (row
// t, column g) B fragments and by rows; a 16-bit row of Kp + 8 elements is 4 words (mod 32) when Kp
// is a multiple of 64, and two lanes reading one word do not conflict), 8 (mod 32) for the dP / dA
// array (read both ways as A fragments). That array holds dP on and below the diagonal and dA,
// strictly lower, transposed above it, but for dA's 16 x 16 diagonal blocks, which the pairs inside
// a sub-chunk read by rows: they keep their rows in an array of their own (read by columns, each
// load took its own address and the registers spilled). dA is staged in the scratch tiles first,
// free until the tasks.
template <typename Qk>
struct BwdIntraLayout {
  int ldk, ldg, ldc;  // elements: q and k (Qk), gamma and the dP / dA array (fp32)
  int q, k, g, pa, da, beta, scale_q, scale_k, part, scratch, bytes;

  __host__ __device__ BwdIntraLayout(int C, int K) {
    using Cfg = BwdIntraConfig<Qk>;
    constexpr int kQk = sizeof(Qk);
    const int Kp = Cfg::padded(K);
    ldk = Kp + (kQk == 2 ? 8 : 4);
    ldg = Kp + 4;
    ldc = C + 8;
    q = 0;                             // [C, ldk] q as given (l2 norm: scale_q)
    k = q + C * ldk * kQk;             // [C, ldk] k as given (l2 norm: scale_k)
    g = k + C * ldk * kQk;             // [C, ldg] gamma * log2(e)
    pa = g + C * ldg * 4;              // [C, ldc] dP and dA^T
    da = pa + C * ldc * 4;             // [C, 16] dA[r, i] of the diagonal blocks at da[r, i % 16]
    beta = da + C * 16 * 4;            // [C]
    scale_q = beta + C * 4;            // [C]
    scale_k = scale_q + C * 4;         // [C]
    part = scale_k + C * 4;            // [Kp / kCols, C] sum_d k dk_rows over each warp's columns
    scratch = part + Kp / Cfg::kCols * C * 4;  // [kWarps, 16, kLdScratch], dA [C, ldc] before
    const int tiles = Cfg::kWarps * 16 * Cfg::kLdScratch * 4, staged = C * ldc * 4;
    bytes = scratch + (tiles > staged ? tiles : staged);
  }
};

// A warp's 16 x 32 accumulator tile in column layout: lane c gets column c of the 16 rows.
template <int kLd, int N>
__device__ __forceinline__ void to_columns(const float (&acc)[N][4], float (&column)[16], float* tile) {
  for_each_acc(acc, [&](int r, int c, float x) { tile[r * kLd + c] = x; });
  __syncwarp();
#pragma unroll
  for (int r = 0; r < 16; ++r) column[r] = tile[r * kLd + threadIdx.x % 32];
  __syncwarp();
}

// Sums x[r] over the warp's lanes for each of 16 rows r, lanes 2 h and 2 h + 1 ending with row h's
// sum in x[0]: a reduce-scatter, each step (kHalf = 8, 4, 2, 1) exchanging half the rows a lane
// holds with lane ^ 2 kHalf, then the pair's sum; 16 shuffles where a butterfly per row takes 80.
// Each row's sum takes the butterfly's pairs in its order: the bits of one.
template <int kHalf = 8>
__device__ __forceinline__ void sum_over_lanes(float (&x)[16]) {
  const bool upper = threadIdx.x & 2 * kHalf;  // keeps rows [kHalf, 2 kHalf) of the ones it holds
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float lo = x[i], hi = x[i + kHalf];
    x[i] = (upper ? hi : lo) + __shfl_xor_sync(0xffffffffu, upper ? lo : hi, 2 * kHalf);
  }
  if constexpr (kHalf > 1) {
    sum_over_lanes<kHalf / 2>(x);
  } else {
    x[0] += __shfl_xor_sync(0xffffffffu, x[0], 1);
  }
}

// kScaled: use_qk_l2norm_in_kernel (the row scales exist). Without it the kernel multiplies by
// nothing: scales of 1 cost it registers (ptxas spilled 32 bytes) and 8% of its time.
template <Products kP, typename Dims, typename Qk, bool kScaled>
__global__ void __launch_bounds__(BwdIntraConfig<Qk>::kThreads, BwdIntraConfig<Qk>::kMinBlocks)
    bwd_intra_kernel(const __grid_constant__ BackwardParams p) {
  using Cfg = BwdIntraConfig<Qk>;
  constexpr int kCols = Cfg::kCols, kN = kCols / 8;
  const ForwardParams& f = p.fwd;
  const ChunkSpan c = chunk_span(f, blockIdx.x);
  const int head = blockIdx.y, C = Dims::chunk(f), K = Dims::k(f), l = static_cast<int>(c.rows);
  const int Kp = Cfg::padded(K);
  const BwdIntraLayout<Qk> L(C, K);
  const int ldk = L.ldk, ldg = L.ldg, ldc = L.ldc;
  extern __shared__ __align__(16) char smem_bytes[];
  Qk* q = reinterpret_cast<Qk*>(smem_bytes + L.q);
  Qk* k = reinterpret_cast<Qk*>(smem_bytes + L.k);
  float* g = reinterpret_cast<float*>(smem_bytes + L.g);
  float* pa = reinterpret_cast<float*>(smem_bytes + L.pa);
  float* da = reinterpret_cast<float*>(smem_bytes + L.da);
  float* beta = reinterpret_cast<float*>(smem_bytes + L.beta);
  float* scale_q = reinterpret_cast<float*>(smem_bytes + L.scale_q);
  float* scale_k = reinterpret_cast<float*>(smem_bytes + L.scale_k);
  float* part = reinterpret_cast<float*>(smem_bytes + L.part);
  float* scratch = reinterpret_cast<float*>(smem_bytes + L.scratch);
  const int tid = threadIdx.x, nthreads = blockDim.x, warp = tid / 32, lane = tid % 32;
  auto row_at = [&](int r) { return (c.first_row + r) * f.HV + head; };
  // q_hat, k_hat as F2 forms them (forward/workspace.hpp): q and k of the value head's query/key
  // head as given, times the row scales of l2norm, the same fp32 products wherever read.
  auto q_hat = [&](int r, int d) {
    const float x = to_float(q[r * ldk + d]);
    if constexpr (kScaled) return x * scale_q[r];
    else return x;
  };
  auto k_hat = [&](int r, int d) {
    const float x = to_float(k[r * ldk + d]);
    if constexpr (kScaled) return x * scale_k[r];
    else return x;
  };

  // Rows past the chunk's end and columns past K are zero; so are dP above and dA on and above
  // the diagonal (as B1 and B3 store them).
  const int64_t stride_k = static_cast<int64_t>(f.HV) * K, stride_c = static_cast<int64_t>(f.HV) * C;
  copy_rows_async(pa, ldc, p.ws.dP + row_at(0) * C, stride_c, C, C, l, C);
  __nv_bfloat16* scratch16 = reinterpret_cast<__nv_bfloat16*>(scratch);  // [C, ldc] a bf16 dA
  if constexpr (kBf16DA<kP>) {
    copy_rows16_async(scratch16, ldc, bf16_row(p.ws.dA, row_at(0), C), 2 * stride_c, C, C, l, C);
  } else {
    copy_rows_async(scratch, ldc, p.ws.dA + row_at(0) * C, stride_c, C, C, l, C);
  }
  copy_rows_async(g, ldg, f.ws.gamma + row_at(0) * K, stride_k, C, Kp, l, K);
  const int qk_head = head / (f.HV / f.H);
  const int64_t stride_qk = static_cast<int64_t>(f.io_H) * K, qk_first = (c.io_row * f.io_H + qk_head) * K;
  const Qk* q_in = static_cast<const Qk*>(f.q) + qk_first;
  const Qk* k_in = static_cast<const Qk*>(f.k) + qk_first;
  if constexpr (Cfg::kNarrow) {
    copy_rows16_async(q, ldk, q_in, stride_qk, C, Kp, l, K);
    copy_rows16_async(k, ldk, k_in, stride_qk, C, Kp, l, K);
  } else {
    copy_rows_async(q, ldk, q_in, stride_qk, C, Kp, l, K);
    copy_rows_async(k, ldk, k_in, stride_qk, C, Kp, l, K);
  }
  cp_async_commit();
  // B3's partials, read back at the end of every task: asked into L2 now where dq's and dk's are
  // bf16 (2 K bytes a row). Where they are fp32 (GVA, l2norm) asking cost more than it saved: 2.67
  // -> 2.46 ms without at gva_B2_T8192_H16_HV64 on an H100 (docs/design.md). `ahead`: rows asked.
  const bool bf16_partials = bf16_qk_partials<kP>(p);
  const int partial_bytes = 2 * K, ahead = bf16_partials ? l : 0;
  prefetch_rows_l2(p.ws.dq + row_at(0) * K, 4 * stride_k, ahead, partial_bytes);
  prefetch_rows_l2(p.ws.dk + row_at(0) * K, 4 * stride_k, ahead, partial_bytes);
  prefetch_rows_l2(p.ws.dgamma + row_at(0) * K, 4 * stride_k, ahead, 4 * K);
  for (int r = tid; r < C; r += nthreads) {
    const bool valid = r < l;
    beta[r] = valid ? f.ws.beta_act[row_at(r)] : 0.f;
    if constexpr (kScaled) {
      const int64_t row = (c.first_row + r) * f.H + qk_head;
      scale_q[r] = valid ? f.ws.scale_q[row] : 1.f;
      scale_k[r] = valid ? f.ws.scale_k[row] : 1.f;
    }
  }
  cp_async_wait<0>();
  __syncthreads();
  to_log2_units(g, C, Kp, ldg);
  for (int x = tid; x < C * C; x += nthreads) {  // dA[r, i], i < r, to pa[i, r] or da[r, i % 16]
    const int r = x / C, i = x % C;
    if (i >= r) continue;
    const float dA = kBf16DA<kP> ? __bfloat162float(scratch16[r * ldc + i]) : scratch[r * ldc + i];
    (i >= r / 16 * 16 ? da[r * 16 + i % 16] : pa[i * ldc + r]) = dA;
  }
  __syncthreads();

  const int groups = Kp / kCols;
  for (int task = warp; task < ceil_div(l, 16) * groups; task += Cfg::kWarps) {
    const int R0 = task / groups * 16, c0 = task % groups * kCols, last = R0 + 15;
    const bool has_cols = last + 1 < l;  // a row past the sub-chunk holds a token
    const int gq = lane / 4, t = lane % 4;
    float dq_rows[kN][4] = {}, dk_rows[kN][4] = {}, dk_cols[kN][4] = {};
    // Row side, key rows i < R0: (dP, dA)[r, i] . (k_i exp(g_R0 - g_i)), then * exp(g_r - g_R0).
    for (int i0 = 0; i0 < R0; i0 += 8) {
      const FragA fp = load_frag_a<kP>([&](int r, int i) { return pa[(R0 + r) * ldc + i]; }, i0);
      const FragA fa = load_frag_a<kP>([&](int r, int i) { return pa[i * ldc + R0 + r]; }, i0);
#pragma unroll
      for (int n = 0; n < kN; ++n) {
        const int d = c0 + 8 * n + gq;
        const int i = i0 + t;
        const SplitTf32 b0 = split_tf32<kP>(k_hat(i, d) * exp2_fast(g[R0 * ldg + d] - g[i * ldg + d]));
        const SplitTf32 b1 = split_tf32<kP>(k_hat(i + 4, d) * exp2_fast(g[R0 * ldg + d] - g[(i + 4) * ldg + d]));
        mma_split<kP>(dq_rows[n], fp, b0, b1);
        mma_split<kP>(dk_rows[n], fa, b0, b1);
      }
    }
    // Column side, rows j past the sub-chunk: (dP, dA)[j, r] . (q_j, beta_j k_j) exp(g_j - g_last),
    // then * exp(g_last - g_r). Only when a row past the sub-chunk holds a token (so g_last does).
    if (has_cols) {
      for (int j0 = last + 1; j0 < C; j0 += 8) {
        const FragA fp = load_frag_a<kP>([&](int r, int j) { return pa[j * ldc + R0 + r]; }, j0);
        const FragA fa = load_frag_a<kP>([&](int r, int j) { return pa[(R0 + r) * ldc + j]; }, j0);
#pragma unroll
        for (int n = 0; n < kN; ++n) {
          const int d = c0 + 8 * n + gq;
          float bq[2], bk[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int j = j0 + t + 4 * h;
            const float e = j < l ? exp2_fast(g[j * ldg + d] - g[last * ldg + d]) : 0.f;
            bq[h] = q_hat(j, d) * e;
            bk[h] = beta[j] * k_hat(j, d) * e;
          }
          mma_split<kP>(dk_cols[n], fp, split_tf32<kP>(bq[0]), split_tf32<kP>(bq[1]));
          mma_split<kP>(dk_cols[n], fa, split_tf32<kP>(bk[0]), split_tf32<kP>(bk[1]));
        }
      }
    }
    // The rest runs in column layout: lane owns column d of the sub-chunk's 16 rows, so the terms
    // inside the sub-chunk read their operands once per pair and the updates are coalesced. The
    // products cross over through the warp's scratch tile.
    float* tile = scratch + warp * 16 * Cfg::kLdScratch;
    float dq[16], dkr[16], dkc[16];
    to_columns<Cfg::kLdScratch>(dq_rows, dq, tile);
    to_columns<Cfg::kLdScratch>(dk_rows, dkr, tile);
    to_columns<Cfg::kLdScratch>(dk_cols, dkc, tile);
    const int d = c0 + lane, rows = min(16, l - R0);
    // Rows past the chunk's end take the last row's gamma: their exponentials stay <= 1 (their
    // operands are zero), where gamma = 0 could overflow.
    float gc[16], kc[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      gc[r] = g[(R0 + min(r, rows - 1)) * ldg + d];
      kc[r] = k_hat(R0 + r, d);
    }
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const float up = exp2_fast(gc[r] - gc[0]);
      dq[r] *= up;
      dkr[r] *= up;
      dkc[r] = has_cols ? dkc[r] * exp2_fast(gc[15] - gc[r]) : 0.f;
    }
    // Pairs (r, i <= r) inside the sub-chunk, one exponential each: the row side of r, the column
    // side of i. dA is zero on the diagonal.
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const float* p_row = pa + (R0 + r) * ldc + R0;
      const float* a_row = da + (R0 + r) * 16;
      const float q_r = q_hat(R0 + r, d), bk_r = beta[R0 + r] * kc[r];
#pragma unroll
      for (int i = 0; i <= r; ++i) {
        const float e = i == r ? 1.f : exp2_fast(gc[r] - gc[i]), pe = p_row[i] * e;
        const float ae = i == r ? 0.f : a_row[i] * e;
        dq[r] += pe * kc[i];
        dkr[r] += ae * kc[i];
        dkc[i] += pe * q_r + ae * bk_r;
      }
    }
    // sum_d k dk_rows over the warp's columns for dbeta.
    float kdk[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) kdk[r] = kc[r] * dkr[r];
    sum_over_lanes(kdk);
    if (lane % 2 == 0) part[c0 / kCols * C + R0 + lane / 2] = kdk[0];
    // Update B3's partials (the elements of one chunk and head belong to this block alone: no
    // atomics). The partials of the next kBatch rows are loaded before this batch's are stored, so
    // each batch's loads wait behind the batch before.
    constexpr int kBatch = 2;
    const int64_t first = row_at(R0) * K + d;  // row r of the sub-chunk is r * stride_k further
    // The same in dq and dk as given (qk_in_intra: query/key heads are the value heads).
    const int64_t io_first = ((c.io_row + R0) * f.io_HV + head) * K + d, io_k = static_cast<int64_t>(f.io_HV) * K;
    auto load_old = [&](int r0, float3(&old)[kBatch]) {
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int64_t at = first + (r0 + b) * stride_k;
        if (r0 + b >= rows || d >= K) continue;
        old[b] = make_float3(load_partial(p.ws.dq, at, d, bf16_partials), load_partial(p.ws.dk, at, d, bf16_partials),
                             p.ws.dgamma[at]);
      }
    };
    float3 old[kBatch], next[kBatch];
    load_old(0, old);
#pragma unroll
    for (int r0 = 0; r0 < 16; r0 += kBatch) {
      if (r0 + kBatch < 16) load_old(r0 + kBatch, next);
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int r = r0 + b;
        if (r >= rows || d >= K) continue;
        const int64_t at = first + r * stride_k;
        const float dk_rows_r = dkr[r] * beta[R0 + r], dq_total = old[b].x + dq[r];
        const float dk_total = old[b].y + (dk_rows_r + dkc[r]);
        if (p.qk_in_intra) {  // (token, value head) rows are (token, query/key head) rows
          if (p.dq != nullptr) store_float(p.dq, f.qk_dtype, io_first + r * io_k, dq_total);
          if (p.dk != nullptr) store_float(p.dk, f.qk_dtype, io_first + r * io_k, dk_total);
        } else {
          p.ws.dq[at] = dq_total;
          p.ws.dk[at] = dk_total;
        }
        p.ws.dgamma[at] = old[b].z + (q_hat(R0 + r, d) * dq[r] + kc[r] * (dk_rows_r - dkc[r]));
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) old[b] = next[b];
    }
  }
  __syncthreads();
  // dbeta_r += sum_d k_r,d dk_rows_r,d, the column groups summed in a fixed order.
  for (int r = tid; r < l; r += nthreads) {
    float sum = 0.f;
    for (int group = 0; group < groups; ++group) sum += part[group * C + r];
    p.ws.dbeta[row_at(r)] += sum;
  }
}

}  // namespace fkt::cuda
