// F2 inside fwd_intra (forward/fwd_intra.cuh): P and A of a chunk, 16 x 16 block by block on tensor
// cores with the reference-row factorisation of kda-math.md 3.4.
#pragma once

#include "cuda/common/convert.cuh"
#include "cuda/common/fast_exp.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/mma_pairs.cuh"
#include "cuda/common/vec4.cuh"
#include "cuda/sm90/forward/intra_factors.cuh"
#include "cuda/sm90/forward/intra_tiles.cuh"

namespace fkt::cuda {

// Row r and column i of the idx-th pair (i < r) of a strictly lower triangle, row by row.
__device__ __forceinline__ int2 strict_pair(int idx) {
  int r = static_cast<int>((sqrtf(8.f * idx + 1.f) + 1.f) * 0.5f);
  if (r * (r - 1) / 2 > idx) --r;
  if ((r + 1) * r / 2 <= idx) ++r;
  return {r, idx - r * (r - 1) / 2};
}

// The stores of P's blocks: P[r, i:i + 2] (i even) at element `first` of the (token, value head)
// rows in P_dtype (ws.P, the forward's saved P when it saves).
struct PRows {
  const ForwardParams& p;
  int64_t first, stride;
  bool paired;

  __device__ PRows(const ForwardParams& params, int C, int64_t first_element)
      : p(params), first(first_element), stride(static_cast<int64_t>(params.HV) * C),
        paired(pairs_aligned(params.ws.P, params.ws.P_dtype, stride)) {}
  __device__ void store(int r, int i, float2 x) const {
    store_pair(p.ws.P, p.ws.P_dtype, first + r * stride + i, x, true, paired);
  }
  // The block at (R0, c0) times the op's scale, its rows below l; on the diagonal zero above it.
  __device__ void store_block(const float (&acc)[2][4], int R0, int c0, bool diagonal, int l) const {
    for_each_acc_pair(acc, [&](int r, int i, float2 x) {
      if (R0 + r >= l) return;
      auto kept = [&](int col, float v) { return !diagonal || col <= r ? p.scale * v : 0.f; };
      store(R0 + r, c0 + i, make_float2(kept(i, x.x), kept(i + 1, x.y)));
    });
  }
  // P's zeros above the live diagonal blocks (rows of kSub), by `threads` threads from `thread`.
  __device__ void store_zeros(int C, int l, int kSub, int thread, int threads) const {
    for (int x = thread; x < l * (C / 2); x += threads) {
      const int r = x / (C / 2), i = 2 * (x % (C / 2));
      if (i >= (r / kSub + 1) * kSub) store(r, i, make_float2(0.f, 0.f));
    }
  }
};

// A's block at (R0, c0) into A's tile: beta_r times the accumulator; on the diagonal zero on and
// above it.
template <typename In, bool kScaled>
__device__ __forceinline__ void store_a_block(const IntraTiles<In, kScaled>& tiles, const float (&acc)[2][4], int R0,
                                              int c0, bool diagonal) {
  for_each_acc(acc, [&](int r, int i, float x) {
    tiles.A[(R0 + r) * tiles.ldc + c0 + i] = !diagonal || i < r ? tiles.beta[R0 + r] * x : 0.f;
  });
}

// The 16 x 16 block (R0, c0) of P / s and A / beta of a chunk of l rows, added to acc_p and acc_a:
// P[r, i] = s sum_d q_r k_i exp(g_r - g_i) for i <= r, A[r, i] = beta_r sum_d k_r k_i exp(g_r - g_i)
// for i < r, on tensor cores as (q_r exp(g_r - g_m)) . (k_i exp(g_m - g_i)) at a reference row m
// (kda-math.md 3.4). Below the diagonal m is R's first row: both factors <= 1. On the diagonal m is
// the block's midpoint, and one factor exceeds 1: the block stays on tensor cores while every
// exponent is at most kReach in magnitude (always under safe_gate's per-step bound), else the warp
// evaluates it element by element in fp32.
template <Products kP, typename In, bool kScaled>
__device__ __forceinline__ void tf32_block(const IntraTiles<In, kScaled>& tiles, int Kp, int l, bool diagonal, int R0,
                                           int c0, float (&acc_p)[2][4], float (&acc_a)[2][4]) {
  constexpr int kSub = IntraConfig<In>::kSub;
  constexpr float kReach = 64.f;
  const int ldg = tiles.ldg, lane = threadIdx.x % 32, gq = lane / 4, t = lane % 4;
  const float* g = tiles.g;
  const float* g_ref = g + (diagonal ? R0 + min(kSub / 2, l - R0 - 1) : R0) * ldg;
  float reach = 0.f;  // the largest |exponent| of the diagonal block's valid rows
  // Four k-steps a pass: their shared-memory addresses become offsets of one base (the loop was
  // issue-bound, a third of its instructions address arithmetic: 123 -> 98 a k-step).
#pragma unroll 4
  for (int k0 = 0; k0 < Kp; k0 += 8) {
    FragA fq, fk;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = R0 + gq + (j & 1) * 8, d = k0 + t + (j >> 1) * 4;
      const float x = g[r * ldg + d] - g_ref[d];
      if (diagonal && r < l) reach = fmaxf(reach, fabsf(x));
      const float e = r < l ? exp2_fast(x) : 0.f;
      fq.x[j] = split_tf32<kP>(tiles.q_at(r, d) * e);
      fk.x[j] = split_tf32<kP>(tiles.k_at(r, d) * e);
    }
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const int i = c0 + 8 * n + gq;
      SplitTf32 b[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int d = k0 + t + 4 * h;
        const float x = g_ref[d] - g[i * ldg + d];
        if (diagonal && i < l) reach = fmaxf(reach, fabsf(x));
        b[h] = split_tf32<kP>(i < l ? tiles.k_at(i, d) * exp2_fast(x) : 0.f);
      }
      mma_split<kP>(acc_p[n], fq, b[0], b[1]);
      mma_split<kP>(acc_a[n], fk, b[0], b[1]);
    }
  }
  if (diagonal && __any_sync(0xffffffffu, reach > kReach)) {
    // The lane's accumulator elements (r, i), i <= r, as (q_r, k_r) . (k_i exp(g_r - g_i)).
#pragma unroll 1
    for (int x = 0; x < 8; ++x) {
      const int r = R0 + gq + (x % 4 >= 2 ? 8 : 0), i = R0 + 8 * (x / 4) + 2 * t + (x & 1);
      float qk = 0.f, kk = 0.f;
      if (r < l && i <= r) {
        for (int d = 0; d < Kp; d += 4) {
          const float4 gr = load4(g + r * ldg + d), gi = load4(g + i * ldg + d);
          const float4 e = map4([](float a, float b, float y) { return exp2_fast(a - b) * y; }, gr, gi, tiles.k4(i, d));
          qk += dot4(tiles.q4(r, d), e);
          kk += dot4(tiles.k4(r, d), e);
        }
      }
#pragma unroll
      for (int y = 0; y < 8; ++y) {
        if (y == x) {
          acc_p[y / 4][y % 4] = qk;
          acc_a[y / 4][y % 4] = kk;
        }
      }
    }
  }
}

// P and A of a chunk of l rows: P stored (PRows) zero above its live diagonal blocks; A into A's
// tile, in q's room once every warp has read q: the live blocks on and below the diagonal, zero on
// and above it. The warps with fewer blocks than others take the zeros of P and then
// side(thread, threads), work that neither writes shared memory nor waits for P or A.
template <Products kP, typename In, bool kScaled, typename Side>
__device__ __forceinline__ void p_and_a(const ForwardParams& p, const IntraTiles<In, kScaled>& tiles, int C, int Kp,
                                        int l, int64_t first, Side side) {
  using Config = IntraConfig<In>;
  constexpr int kSub = Config::kSub, kWarps = Config::kWarps;
  // A warp's tasks: at most kRounds for chunks of up to 64 rows (4 sub-chunks, 10 blocks), whose
  // A accumulators it holds until q is dead.
  constexpr int kMaxSubs = 64 / kSub, kRounds = ceil_div(kMaxSubs * (kMaxSubs + 1) / 2, kWarps);
  const int live = ceil_div(l, kSub), tasks = live * (live + 1) / 2, warp = threadIdx.x / 32;
  const PRows P(p, C, first);
  // The warp's block in a round: its first row R0 and column c0 (the live diagonal blocks first).
  struct Block {
    bool diagonal;
    int R0, c0;
  };
  auto block_of = [&](int round) {
    const int task = warp + round * kWarps;
    const int2 rj = task < live ? make_int2(task, task) : strict_pair(task - live);  // (R, J)
    return Block{task < live, rj.x * kSub, rj.y * kSub};
  };
  auto has_block = [&](int round) { return warp + round * kWarps < tasks; };
  float acc_a[kRounds][2][4] = {};
#pragma unroll
  for (int round = 0; round < kRounds; ++round) {
    if (!has_block(round)) break;
    const Block b = block_of(round);
    float acc_p[2][4] = {};
    tf32_block<kP>(tiles, Kp, l, b.diagonal, b.R0, b.c0, acc_p, acc_a[round]);
    P.store_block(acc_p, b.R0, b.c0, b.diagonal, l);
  }
  // The warps below `heavy` hold one block more than the others; when all hold as many, every warp
  // takes the side work.
  const int most = ceil_div(tasks, kWarps), heavy = tasks - (most - 1) * kWarps;
  const int side_first = heavy == kWarps ? 0 : heavy * 32, side_threads = blockDim.x - side_first;
  if (static_cast<int>(threadIdx.x) >= side_first) {
    const int thread = threadIdx.x - side_first;
    P.store_zeros(C, l, kSub, thread, side_threads);
    side(thread, side_threads);
  }
  __syncthreads();  // q is dead
#pragma unroll
  for (int round = 0; round < kRounds; ++round) {
    if (!has_block(round)) break;
    const Block b = block_of(round);
    store_a_block(tiles, acc_a[round], b.R0, b.c0, b.diagonal);
  }
}

// P and A as p_and_a stores them, at C = kC and K = kK, the six blocks below the diagonal from fp16
// factors (forward/intra_factors.cuh): the diagonal blocks first on warps R (tf32_block, reading
// the sub-chunk's rows of q, k and gamma), while the other warps store P's zeros; then the factors
// of every row take those rooms (form_factors, operands(...) its other uses of the row's values);
// then the blocks below the diagonal on warps 0 to 5 (strict_pair), as fp16 products.
template <Products kP, int kC, int kK, typename In, bool kScaled, typename Operands>
__device__ __forceinline__ void p_and_a_from_factors(const ForwardParams& p, const IntraTiles<In, kScaled>& tiles,
                                                     int l, int64_t first, Operands operands) {
  constexpr int kSub = IntraConfig<In>::kSub, kSubs = kC / kSub;
  static_assert(kSubs * (kSubs - 1) / 2 <= IntraConfig<In>::kWarps, "a block below the diagonal a warp");
  const int live = ceil_div(l, kSub), warp = threadIdx.x / 32;
  const PRows P(p, kC, first);
  float acc_diagonal[2][4] = {}, acc_below[2][4] = {};
  if (warp < live) {
    float acc_p[2][4] = {};
    tf32_block<kP>(tiles, kK, l, true, warp * kSub, warp * kSub, acc_p, acc_diagonal);
    P.store_block(acc_p, warp * kSub, warp * kSub, true, l);
  } else {
    P.store_zeros(kC, l, kSub, threadIdx.x - live * 32, blockDim.x - live * 32);
  }
  __syncthreads();  // the diagonal blocks have read q, k and gamma
  const IntraFactors<kC, kK> factors(tiles);
  form_factors<kC, kK>(tiles, factors, l, operands);
  __syncthreads();
  const int2 rj = strict_pair(warp);  // (R, J)
  const bool below = warp < kSubs * (kSubs - 1) / 2 && rj.x < live;
  if (below) {
    float acc_p[2][4] = {};
    factored_block(factors, rj.x, rj.y, acc_p, acc_below);
    P.store_block(acc_p, rj.x * kSub, rj.y * kSub, false, l);
  }
  __syncthreads();  // Qf is dead
  if (warp < live) store_a_block(tiles, acc_diagonal, warp * kSub, warp * kSub, true);
  if (below) store_a_block(tiles, acc_below, rj.x * kSub, rj.y * kSub, false);
}

}  // namespace fkt::cuda
