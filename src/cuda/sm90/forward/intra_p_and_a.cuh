// F2 inside fwd_intra (forward/fwd_intra.cuh): P and A of a chunk, 16 x 16 block by block on tensor
// cores with the reference-row factorisation of kda-math.md 3.4.
#pragma once

#include "cuda/common/convert.cuh"
#include "cuda/common/fast_exp.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/mma_pairs.cuh"
#include "cuda/common/vec4.cuh"
#include "cuda/sm90/forward/intra_tiles.cuh"

namespace fkt::cuda {

// Row r and column i of the idx-th pair (i < r) of a strictly lower triangle, row by row.
__device__ __forceinline__ int2 strict_pair(int idx) {
  int r = static_cast<int>((sqrtf(8.f * idx + 1.f) + 1.f) * 0.5f);
  if (r * (r - 1) / 2 > idx) --r;
  if ((r + 1) * r / 2 <= idx) ++r;
  return {r, idx - r * (r - 1) / 2};
}

// P and A of a chunk of l rows: P stored (P_dtype into ws.P, the forward's saved P when it saves) at
// element `first` of the (token, value head) rows, zero above its live diagonal blocks; A into A's
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
  const int live = ceil_div(l, kSub), tasks = live * (live + 1) / 2;
  const int ldg = tiles.ldg, ldc = tiles.ldc, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* g = tiles.g;
  const float* beta = tiles.beta;
  const int64_t stride = static_cast<int64_t>(p.HV) * C;
  const bool paired = pairs_aligned(p.ws.P, p.ws.P_dtype, stride);
  auto store_p = [&](int r, int i, float2 x) {  // P[r, i:i + 2], i even
    store_pair(p.ws.P, p.ws.P_dtype, first + r * stride + i, x, true, paired);
  };
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
  // P[r, i] = s sum_d q_r k_i exp(g_r - g_i) for i <= r, A[r, i] = beta_r sum_d k_r k_i exp(g_r - g_i)
  // for i < r, by 16 x 16 blocks (R, J), on tensor cores as (q_r exp(g_r - g_m)) . (k_i exp(g_m - g_i))
  // at a reference row m (kda-math.md 3.4). Below the diagonal m is R's first row: both factors <= 1.
  // On the diagonal m is the block's midpoint, and one factor exceeds 1: the block stays on tensor
  // cores while every exponent is at most kReach in magnitude (always under safe_gate's per-step
  // bound), else the warp evaluates it element by element in fp32.
  constexpr float kReach = 64.f;
  const int gq = lane / 4, t = lane % 4;
  float acc_a[kRounds][2][4] = {};
#pragma unroll
  for (int round = 0; round < kRounds; ++round) {
    if (!has_block(round)) break;
    const Block block = block_of(round);
    const bool diagonal = block.diagonal;
    const int R0 = block.R0, c0 = block.c0;
    const float* g_ref = g + (diagonal ? R0 + min(kSub / 2, l - R0 - 1) : R0) * ldg;
    float acc_p[2][4] = {};
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
        mma_split<kP>(acc_a[round][n], fk, b[0], b[1]);
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
            acc_a[round][y / 4][y % 4] = kk;
          }
        }
      }
    }
    for_each_acc_pair(acc_p, [&](int r, int i, float2 x) {
      if (R0 + r >= l) return;
      auto kept = [&](int col, float v) { return !diagonal || col <= r ? p.scale * v : 0.f; };
      store_p(R0 + r, c0 + i, make_float2(kept(i, x.x), kept(i + 1, x.y)));
    });
  }
  // The warps below `heavy` hold one block more than the others; when all hold as many, every warp
  // takes the side work.
  const int most = ceil_div(tasks, kWarps), heavy = tasks - (most - 1) * kWarps;
  const int side_first = heavy == kWarps ? 0 : heavy * 32, side_threads = blockDim.x - side_first;
  if (static_cast<int>(threadIdx.x) >= side_first) {
    const int thread = threadIdx.x - side_first;
    for (int x = thread; x < l * (C / 2); x += side_threads) {  // P above the live diagonal blocks
      const int r = x / (C / 2), i = 2 * (x % (C / 2));
      if (i >= (r / kSub + 1) * kSub) store_p(r, i, make_float2(0.f, 0.f));
    }
    side(thread, side_threads);
  }
  __syncthreads();  // q is dead
#pragma unroll
  for (int round = 0; round < kRounds; ++round) {
    if (!has_block(round)) break;
    const Block b = block_of(round);
    for_each_acc(acc_a[round], [&](int r, int i, float x) {
      tiles.A[(b.R0 + r) * ldc + b.c0 + i] = !b.diagonal || i < r ? beta[b.R0 + r] * x : 0.f;
    });
  }
}

}  // namespace fkt::cuda
