// F2 and F3 on CUDA, one block per (chunk, value head): P and A of the chunk, T = (I + A)^-1, then
// W = T diag(beta) K_up, U = T diag(beta) V, K_down and Q_up. The chunk is cut into 16-row
// sub-chunks (one tensor-core row tile): the 16 x 16 diagonal blocks of P and A keep the pairwise
// exponentials, the blocks below them use the reference-row factorisation of kda-math.md 3.4 on
// tensor cores, T is inverted block by block, and U, W are tensor-core products (common/mma.cuh).
#pragma once

#include "cuda/common/convert.cuh"
#include "cuda/common/fast_exp.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/round_up.hpp"
#include "cuda/common/tile_copy.cuh"
#include "cuda/common/vec4.cuh"
#include "cuda/sm90/forward/chunks.cuh"

namespace fkt::cuda {

struct IntraConfig {
  static constexpr int kThreads = 512;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kSub = 16;  // sub-chunk rows
  __host__ __device__ static int padded(int x) { return round_up<8>(x); }
};

// fp32 shared memory, offsets in floats. The row strides make the mma fragment reads conflict
// free: ldk, ldc = 4 (mod 32) for operands read as (row g, column t), ldx = 8 (mod 32) for the B
// operand read as (row t, column g) (g = lane / 4, t = lane % 4).
struct IntraLayout {
  int ldk, ldx, ldc;
  int q, k, g, x, A, T, Y, beta, floats;

  __host__ __device__ IntraLayout(int C, int K, int V) {
    const int Kp = IntraConfig::padded(K), Vp = IntraConfig::padded(V);
    ldk = Kp + 4;
    ldx = (Kp > Vp ? Kp : Vp) + 8;
    ldc = C + 4;
    q = 0;                                          // [C, ldk] q, l2-normalised when asked
    k = q + C * ldk;                                // [C, ldk]
    g = k + C * ldk;                                // [C, ldk] gamma * log2(e)
    x = g + C * ldk;                                // [C, ldx] v, then beta * k * exp(gamma)
    A = x + C * ldx;                                // [C, ldc] strictly lower
    T = A + C * ldc;                                // [C, ldc] P (staged), then (I + A)^-1; zeroed with A
    Y = T + C * ldc;                                // [C / 16 - 1, 16, 16] partial products of T
    beta = Y + (C / IntraConfig::kSub - 1) * IntraConfig::kSub * IntraConfig::kSub;  // [C]
    floats = beta + C;
  }
  static size_t bytes(int C, int K, int V) { return sizeof(float) * IntraLayout(C, K, V).floats; }
};

__device__ __forceinline__ float activate_beta(BetaMode mode, float b) {
  if (mode == BetaMode::kPlain) return b;
  const float s = 1.f / (1.f + expf(-b));
  return mode == BetaMode::kSigmoid ? s : 2.f * s;
}

// Scales each of `rows` rows of x [rows, K] (row stride ld) by 1 / sqrt(sum of squares + 1e-6)
// (kda-math.md 2.3).
__device__ __forceinline__ void l2norm_rows(float* x, int rows, int K, int ld) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < rows; r += IntraConfig::kWarps) {
    float sum = 0.f;
    for (int d = lane; d < K; d += 32) sum += x[r * ld + d] * x[r * ld + d];
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    const float rstd = 1.f / sqrtf(sum + 1e-6f);  // as bwd_prepare and the CPU evaluate it
    for (int d = lane; d < K; d += 32) x[r * ld + d] *= rstd;
  }
}

// Row r and column i of the idx-th pair (i < r) of a 16 x 16 strictly lower triangle, row by row.
__device__ __forceinline__ int2 strict_pair(int idx) {
  int r = static_cast<int>((sqrtf(8.f * idx + 1.f) + 1.f) * 0.5f);
  if (r * (r - 1) / 2 > idx) --r;
  if ((r + 1) * r / 2 <= idx) ++r;
  return {r, idx - r * (r - 1) / 2};
}

// The blocks of T = (I + A)^-1 below its diagonal, nearest the diagonal first, given its diagonal
// blocks: T_RI = -T_RR Y_RI with Y_RI = sum_{I <= M < R} A_RM T_MI (16 x 16 blocks; A, T [C, ldc],
// scratch Y of (subs - 1) 16 x 16 blocks). Each distance waits for the one before.
// kTf32 (bfloat16 inputs): warp tasks (block, 8-column half) on tensor cores in split 3xTF32.
// kSplit3 (float16 / float32 inputs): fp32 FMAs, one thread per element: the inverse keeps fp32
// accuracy (3xTF32 drifted the float32 context-parallel gradients past their 1e-5 check).
template <Products kP>
__device__ __forceinline__ void invert_below_diagonal(const float* A, float* T, float* Y, int ldc, int subs) {
  constexpr int kSub = IntraConfig::kSub, kWarps = IntraConfig::kWarps;
  const int tid = threadIdx.x, warp = tid / 32;
  for (int dist = 1; dist < subs; ++dist) {
    if constexpr (kP == Products::kTf32) {
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

template <Products kP>
__global__ void __launch_bounds__(IntraConfig::kThreads, 1)
    fwd_intra_kernel(const __grid_constant__ ForwardParams p) {
  constexpr int kSub = IntraConfig::kSub, kWarps = IntraConfig::kWarps;
  const ChunkSpan c = chunk_span(p, blockIdx.x);
  const int head = blockIdx.y, qk_head = head / (p.HV / p.H);
  const int C = p.chunk, K = p.K, V = p.V, l = static_cast<int>(c.rows);
  const int Kp = IntraConfig::padded(K), Vp = IntraConfig::padded(V);
  const int subs = C / kSub, live = (l + kSub - 1) / kSub;  // sub-chunks, those holding tokens
  const IntraLayout L(C, K, V);
  const int ldk = L.ldk, ldx = L.ldx, ldc = L.ldc;
  extern __shared__ __align__(16) float smem[];
  float* q = smem + L.q;
  float* k = smem + L.k;
  float* g = smem + L.g;
  float* X = smem + L.x;
  float* A = smem + L.A;
  float* T = smem + L.T;
  float* Y = smem + L.Y;
  float* beta = smem + L.beta;
  const int tid = threadIdx.x, nthreads = blockDim.x, warp = tid / 32, lane = tid % 32;
  auto row_at = [&](int r) { return (c.first_row + r) * p.HV + head; };  // (token, value head) row

  // Rows past the chunk's end and columns past K or V are zero (beta too), so they add nothing.
  const int64_t stride_k = static_cast<int64_t>(p.HV) * K, stride_qk = static_cast<int64_t>(p.H) * K;
  copy_rows_async(g, ldk, p.ws.gamma + row_at(0) * K, stride_k, C, Kp, l, K);
  cp_async_commit();
  {  // v and beta, loaded once q and k are in: asked into L2 first
    const int v_size = element_bytes(p.v_dtype), beta_size = element_bytes(p.beta_dtype);
    prefetch_rows_l2(static_cast<const char*>(p.v) + row_at(0) * V * v_size, v_size * static_cast<int64_t>(p.HV) * V, l,
                     v_size * V);
    for (int r = tid; r < l; r += nthreads) prefetch_l2(static_cast<const char*>(p.beta) + row_at(r) * beta_size);
  }
  const int64_t qk_first = (c.first_row * p.H + qk_head) * K;
  load_rows_as_float<2>({{q, k}}, ldk, {{p.q, p.k}}, p.qk_dtype, qk_first, stride_qk, C, Kp, l, K);
  load_rows_as_float(X, ldx, p.v, p.v_dtype, row_at(0) * V, static_cast<int64_t>(p.HV) * V, C, Vp, l, V);
  for (int r = tid; r < C; r += nthreads) {
    beta[r] = r < l ? activate_beta(p.beta_mode, load_float(p.beta, p.beta_dtype, (c.first_row + r) * p.HV + head)) : 0.f;
  }
  for (int x = 4 * tid; x < 2 * C * ldc; x += 4 * nthreads) store4(A + x, float4{0.f, 0.f, 0.f, 0.f});  // A and T
  cp_async_wait<0>();
  __syncthreads();
  to_log2_units(g, C, Kp, ldk);
  if (p.l2norm) {
    l2norm_rows(q, l, K, ldk);
    l2norm_rows(k, l, K, ldk);
  }
  __syncthreads();
  if (p.ws.q_hat != nullptr) {  // kept for the backward (B0, or keep_forward): what its stages read again
    store_rows(p.ws.q_hat + row_at(0) * K, stride_k, q, ldk, l, K);
    store_rows(p.ws.k_hat + row_at(0) * K, stride_k, k, ldk, l, K);
    for (int r = tid; r < l; r += nthreads) p.ws.beta_act[row_at(r)] = beta[r];
  }

  // P (staged in T) and A: diagonal blocks, P[r, i] = s sum_d q_r k_i exp(g_r - g_i) for i <= r,
  // A[r, i] = beta_r sum_d k_r k_i exp(g_r - g_i) for i < r (exponents <= 0 for non-positive gates).
  // One thread per pair i < r; the diagonal (P only, no exponential) goes to the threads left over,
  // several each, so that a 64-row chunk takes one round of 512 threads.
  constexpr int kStrict = kSub * (kSub - 1) / 2;
  const int strict = live * kStrict;
  for (int x = tid; x < strict; x += nthreads) {
    const int2 pair = strict_pair(x % kStrict);
    const int r = x / kStrict * kSub + pair.x, i = x / kStrict * kSub + pair.y;
    if (r >= l) continue;
    float qk = 0.f, kk = 0.f;
    for (int d = 0; d < Kp; d += 4) {
      const float4 gr = *reinterpret_cast<const float4*>(g + r * ldk + d);
      const float4 gi = *reinterpret_cast<const float4*>(g + i * ldk + d);
      const float4 qr = *reinterpret_cast<const float4*>(q + r * ldk + d);
      const float4 kr = *reinterpret_cast<const float4*>(k + r * ldk + d);
      const float4 ki = *reinterpret_cast<const float4*>(k + i * ldk + d);
      const float e0 = exp2_fast(gr.x - gi.x) * ki.x, e1 = exp2_fast(gr.y - gi.y) * ki.y,
                  e2 = exp2_fast(gr.z - gi.z) * ki.z, e3 = exp2_fast(gr.w - gi.w) * ki.w;
      qk += qr.x * e0 + qr.y * e1 + qr.z * e2 + qr.w * e3;
      kk += kr.x * e0 + kr.y * e1 + kr.z * e2 + kr.w * e3;
    }
    T[r * ldc + i] = p.scale * qk;
    A[r * ldc + i] = beta[r] * kk;
  }
  const int spare = strict < nthreads ? strict : 0;  // threads past the pairs take the diagonal
  for (int r = tid - spare; r >= 0 && r < l; r += nthreads - spare) {
    float qk = 0.f;
    for (int d = 0; d < Kp; d += 4) {
      const float4 qr = *reinterpret_cast<const float4*>(q + r * ldk + d);
      const float4 kr = *reinterpret_cast<const float4*>(k + r * ldk + d);
      qk += qr.x * kr.x + qr.y * kr.y + qr.z * kr.z + qr.w * kr.w;
    }
    T[r * ldc + r] = p.scale * qk;
  }
  // Blocks below the diagonal: sub-chunk R (rows from R0) against key rows i < R0, factored at the
  // reference row R0: (q_r exp(g_r - g_R0)) . (k_i exp(g_R0 - g_i)), both factors <= 1. Warp tasks
  // are (R, 16-column tile), R(R - 1) / 2 of them before sub-chunk R, taken from the last warp down
  // (the first warps carry the pairs above).
  for (int task = kWarps - 1 - warp; task < live * (live - 1) / 2; task += kWarps) {
    int R = 1;
    while ((R + 1) * R / 2 <= task) ++R;
    const int R0 = R * kSub, c0 = (task - R * (R - 1) / 2) * kSub;
    const int gq = lane / 4, t = lane % 4;
    const float* g_ref = g + R0 * ldk;
    float acc_p[2][4] = {}, acc_a[2][4] = {};
    for (int k0 = 0; k0 < Kp; k0 += 8) {
      FragA fq, fk;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = R0 + gq + (j & 1) * 8, d = k0 + t + (j >> 1) * 4;
        const float e = r < l ? exp2_fast(g[r * ldk + d] - g_ref[d]) : 0.f;
        fq.x[j] = split_tf32<kP>(q[r * ldk + d] * e);
        fk.x[j] = split_tf32<kP>(k[r * ldk + d] * e);
      }
      const int d0 = k0 + t, d1 = k0 + t + 4;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const int i = c0 + 8 * n + gq;
        const SplitTf32 b0 = split_tf32<kP>(k[i * ldk + d0] * exp2_fast(g_ref[d0] - g[i * ldk + d0]));
        const SplitTf32 b1 = split_tf32<kP>(k[i * ldk + d1] * exp2_fast(g_ref[d1] - g[i * ldk + d1]));
        mma_split<kP>(acc_p[n], fq, b0, b1);
        mma_split<kP>(acc_a[n], fk, b0, b1);
      }
    }
    for_each_acc(acc_p, [&](int r, int i, float x) { T[(R0 + r) * ldc + c0 + i] = p.scale * x; });
    for_each_acc(acc_a, [&](int r, int i, float x) { A[(R0 + r) * ldc + c0 + i] = beta[R0 + r] * x; });
  }
  __syncthreads();
  store_rows(p.ws.P + row_at(0) * C, static_cast<int64_t>(p.HV) * C, T, ldc, l, C);
  __syncthreads();

  // T = (I + A)^-1 by blocks: each diagonal block by forward substitution (lane i of a half-warp
  // owns column i in registers), then the blocks below it (invert_below_diagonal). The blocks above
  // the diagonal hold zero since the start.
  if (const int b = warp * 2 + lane / kSub, i = lane % kSub; b < subs) {
    const float* a = A + b * kSub * (ldc + 1);
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
  invert_below_diagonal<kP>(A, T, Y, ldc, subs);

  if (p.ws.T != nullptr) {
    store_rows(p.ws.T + row_at(0) * C, static_cast<int64_t>(p.HV) * C, T, ldc, l, C);
  }
  // U = T diag(beta) V, then W = T (beta K_up): warp tasks are (row tile, 32 columns); row tile R
  // reads T's columns below 16 (R + 1) only (T is lower triangular). beta scales T's columns for U.
  auto product = [&](int width, float* out, bool beta_columns) {
    const int groups = (width + 31) / 32;
    for (int task = warp; task < live * groups; task += kWarps) {
      const int R0 = task / groups * kSub, c0 = task % groups * 32;
      float acc[4][4] = {};
      warp_mma<kP, 4>(acc, 0, R0 + kSub,
                      [&](int r, int i) { return T[(R0 + r) * ldc + i] * (beta_columns ? beta[i] : 1.f); },
                      [&](int i, int e) { return c0 + e < width ? X[i * ldx + c0 + e] : 0.f; });
      const bool paired = pairs_aligned(out, DType::kF32, width);
      for_each_acc_pair(acc, [&](int r, int e, float2 pair) {
        if (R0 + r < l && c0 + e < width) {
          store_pair(out, DType::kF32, row_at(R0 + r) * width + c0 + e, pair, c0 + e + 1 < width, paired);
        }
      });
    }
  };
  product(V, p.ws.U, true);
  __syncthreads();
  const float* g_last = g + (l - 1) * ldk;
  float* q_up = p.ws.q_up + row_at(0) * K;
  float* k_down = p.ws.k_down + row_at(0) * K;
  const bool vector = K % 4 == 0;  // 16-byte aligned global rows
  for_each_cell<4>(C, Kp / 4, stride_k, ldk, [&](int r, int d, int64_t at, int s) {
    const float4 gr = load4(g + s), kr = load4(k + s);
    const float4 up = map4([](float x) { return exp2_fast(x); }, gr);
    store4(X + r * ldx + d, map4([&](float kx, float u) { return beta[r] * kx * u; }, kr, up));
    if (r >= l) return;
    store_first(q_up + at, map4([](float qx, float u) { return qx * u; }, load4(q + s), up), K - d, vector);
    const float4 down = map4([](float kx, float last, float gx) { return kx * exp2_fast(last - gx); }, kr,
                             load4(g_last + d), gr);
    store_first(k_down + at, down, K - d, vector);
  });
  __syncthreads();
  product(K, p.ws.W, false);
}

}  // namespace fkt::cuda
