// F1 to F3 on CUDA, one block per (chunk, value head): gamma of the chunk (F1 in shared memory,
// written out for the backward only), P and A, T = (I + A)^-1, then W = T diag(beta) K_up,
// U = T diag(beta) V, K_down and Q_up. The chunk is cut into 16-row sub-chunks (one tensor-core row
// tile): the 16 x 16 blocks of P and A use the reference-row factorisation of kda-math.md 3.4 on
// tensor cores, T is inverted block by block, and U, W are tensor-core products (common/mma.cuh).
// kRecompute (the backward's B0 after a forward that saved T and P: ForwardWorkspace::recompute)
// reads T as the forward stored it and forms neither P, A nor the inverse: the same W and U bits.
#pragma once

#include <type_traits>

#include "cuda/common/convert.cuh"
#include "cuda/common/fast_exp.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/mma_pairs.cuh"
#include "cuda/common/round_up.hpp"
#include "cuda/common/tile_copy.cuh"
#include "cuda/common/vec4.cuh"
#include "cuda/sm90/dims.hpp"
#include "cuda/sm90/forward/chunks.cuh"
#include "cuda/sm90/fwd_gate_cumsum/scan.cuh"

namespace fkt::cuda {

// In: how q, k and v sit in shared memory. 16-bit inputs (q, k and v of one dtype) keep their
// dtype there, exactly, which halves those tiles and lets two blocks share an SM (three at the
// common shape); anything else is widened to fp32 and one block of 512 threads takes the SM.
template <typename In>
struct IntraConfig {
  static constexpr bool kNarrow = sizeof(In) == 2;
  static constexpr int kThreads = kNarrow ? 256 : 512;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kSub = 16;  // sub-chunk rows
  __host__ __device__ static int padded(int x) { return round_up<8>(x); }
  // Resident blocks per SM: three at the common shape (71 KB of shared memory in the forward's
  // layout below, 68 KB in the recompute's, and the 80 registers a thread that three blocks of 256
  // threads leave).
  template <typename Dims>
  static constexpr int min_blocks() {
    if constexpr (!kNarrow) return 1;
    else return std::is_same_v<Dims, CommonDims> ? 3 : 2;
  }
};

// Shared memory, offsets in bytes. Row strides keep the mma fragment reads free of bank conflicts:
// 4 words (mod 32) for operands read as (row g, column t), 8 (mod 32) for B operands read as
// (row t, column g) (g = lane / 4, t = lane % 4); a 16-bit row of Kp + 8 elements is 4 words (mod 32)
// when Kp is a multiple of 64, and two lanes reading one word do not conflict.
// kRecompute (no P, A or inverse) takes three rooms: q's, which holds a 16-bit g as loaded first
// (q then comes after F1's first pass) and T as stored last; k's, which takes v last; and g's.
template <typename In, bool kRecompute = false>
struct IntraLayout {
  int ldk, ldv, ldg, ldc;  // elements: q and k (In), v (In), gamma (fp32), A and T (fp32)
  int q, k, g, g16, A, v, T, Y, beta, scale_q, scale_k, bytes;

  __host__ __device__ IntraLayout(int C, int K, int V) {
    constexpr int kSub = IntraConfig<In>::kSub, kIn = sizeof(In);
    const int Kp = IntraConfig<In>::padded(K), Vp = IntraConfig<In>::padded(V);
    ldk = Kp + (kIn == 2 ? 8 : 4);
    ldv = Vp + 8;
    ldg = Kp + 4;
    ldc = C + 4;
    const int qk_bytes = C * ldk * kIn, v_bytes = C * ldv * kIn, a_bytes = C * ldc * 4, g16_bytes = C * Kp * 2;
    auto larger = [](int x, int y) { return x > y ? x : y; };
    const int room = larger(larger(qk_bytes, a_bytes), larger(v_bytes, g16_bytes));
    q = g16 = 0;  // [C, Kp] a 16-bit g as loaded, then [C, ldk] q as given (l2 norm: scale_q)
    k = room;     // [C, ldk] k as given (l2 norm: scale_k)
    g = 2 * room;  // [C, ldg] a_t, then gamma * log2(e), then K_up
    if constexpr (kRecompute) {
      T = A = q;  // [C, ldc] T as stored (no A)
      v = k;      // [C, ldv] v
    } else {
      A = v = q;  // [C, ldc] A, then [C, ldv] v
      T = k;      // [C, ldc] (I + A)^-1
    }
    Y = g + C * ldg * 4;  // [Kp] gamma's last row; without kRecompute then [C / 16 - 1, 16, 16] partial products of T
    beta = Y + (kRecompute ? Kp : (C / kSub - 1) * kSub * kSub) * 4;  // [C]
    scale_q = beta + C * 4;                         // [C]
    scale_k = scale_q + C * 4;                      // [C]
    bytes = scale_k + C * 4;
  }
};

// The block's shared-memory tiles (IntraLayout) and their row strides, with q_hat and k_hat read as
// fp32: times the row scales of use_qk_l2norm_in_kernel when kScaled, as given otherwise (a multiply
// by scales of 1 cost every operand read a shared load and a multiply).
template <typename In, bool kScaled>
struct IntraTiles {
  In* q;
  In* k;
  float* g;  // a_t (F1's gate), gamma * log2(e), then K_up
  float* A;
  float* T;
  float* Y;
  float* beta;
  float* scale_q;
  float* scale_k;
  int ldk, ldg, ldc;

  __device__ float q_at(int r, int d) const { return scaled(to_float(q[r * ldk + d]), scale_q, r); }
  __device__ float k_at(int r, int d) const { return scaled(to_float(k[r * ldk + d]), scale_k, r); }
  __device__ static float scaled(float x, const float* scale, int r) {
    if constexpr (kScaled) return x * scale[r];
    else return x;
  }
  __device__ float4 q4(int r, int d) const;
  __device__ float4 k4(int r, int d) const;
};

__device__ __forceinline__ float activate_beta(BetaMode mode, float b) {
  if (mode == BetaMode::kPlain) return b;
  const float s = 1.f / (1.f + expf(-b));
  return mode == BetaMode::kSigmoid ? s : 2.f * s;
}

// scale[r] = 1 / sqrt(sum of squares of row r + 1e-6) for the rows r < rows of x [C, K] (row
// stride ld), 1 for the others (kda-math.md 2.3): q_hat = q * scale, formed where it is read, the
// same fp32 product as scaling the rows in place.
template <typename In>
__device__ __forceinline__ void row_scales(const In* x, int rows, int C, int K, int ld, float* scale) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < C; r += IntraConfig<In>::kWarps) {
    float rstd = 1.f;
    if (r < rows) {
      float sum = 0.f;
      for (int d = lane; d < K; d += 32) sum += to_float(x[r * ld + d]) * to_float(x[r * ld + d]);
      for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      rstd = 1.f / sqrtf(sum + 1e-6f);  // as bwd_prepare and the CPU evaluate it
    }
    if (lane == 0) scale[r] = rstd;
  }
}

// Four consecutive elements of a shared-memory row as floats (16-bit rows: one 8-byte load).
template <typename In>
__device__ __forceinline__ float4 load4_as_float(const In* p) {
  if constexpr (sizeof(In) == 4) {
    return load4(p);
  } else {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    const In* e = reinterpret_cast<const In*>(&raw);
    return {to_float(e[0]), to_float(e[1]), to_float(e[2]), to_float(e[3])};
  }
}

template <typename In, bool kScaled>
__device__ __forceinline__ float4 IntraTiles<In, kScaled>::q4(int r, int d) const {
  return map4([&](float x) { return scaled(x, scale_q, r); }, load4_as_float(q + r * ldk + d));
}

template <typename In, bool kScaled>
__device__ __forceinline__ float4 IntraTiles<In, kScaled>::k4(int r, int d) const {
  return map4([&](float x) { return scaled(x, scale_k, r); }, load4_as_float(k + r * ldk + d));
}

// Row r and column i of the idx-th pair (i < r) of a strictly lower triangle, row by row.
__device__ __forceinline__ int2 strict_pair(int idx) {
  int r = static_cast<int>((sqrtf(8.f * idx + 1.f) + 1.f) * 0.5f);
  if (r * (r - 1) / 2 > idx) --r;
  if ((r + 1) * r / 2 <= idx) ++r;
  return {r, idx - r * (r - 1) / 2};
}

// The blocks of T = (I + A)^-1 below its diagonal, nearest the diagonal first, given its diagonal
// blocks: T_RI = -T_RR Y_RI with Y_RI = sum_{I <= M < R} A_RM T_MI (16 x 16 blocks; A, T [C, ldc],
// scratch Y of (subs - 1) 16 x 16 blocks). Each distance waits for the one before.
// kTensorCores (the kTf32 products of bfloat16 inputs): warp tasks (block, 8-column half) on tensor
// cores in split 3xTF32. Otherwise (float16 / float32 inputs): fp32 FMAs, one thread per element:
// the inverse keeps fp32 accuracy (3xTF32 drifted the float32 context-parallel gradients past
// their 1e-5 check).
template <bool kTensorCores, int kWarps>
__device__ __forceinline__ void invert_below_diagonal(const float* A, float* T, float* Y, int ldc, int subs) {
  constexpr int kSub = 16;
  const int tid = threadIdx.x, warp = tid / 32;
  for (int dist = 1; dist < subs; ++dist) {
    if constexpr (kTensorCores) {
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

// The threads of F1's first pass (gate_rows): nthreads / Kp to a column (Kp <= 128 < nthreads),
// thread t on column t % Kp when t < nthreads / Kp * Kp.
__device__ __forceinline__ bool gates_a_column(int Kp) { return threadIdx.x < blockDim.x / Kp * Kp; }

// F1's first pass in shared memory: x[r, d] = a_t, the gate of g[r, d], for the rows r < rows and
// columns d < K of g ([C, ld_g] elements of G as loaded), and 0 for the other rows r < C and columns
// d < Kp of x ([C, ld_x] fp32; x may be g). A thread that gates_a_column passes the gate of its
// column, its rows in batches whose loads come before their stores: one shared-memory latency per
// batch, not per element.
template <typename G>
__device__ __forceinline__ void gate_rows(const G* g, int ld_g, float* x, int ld_x, int C, int rows, int K, int Kp,
                                          const ColumnGate& gate) {
  constexpr int kBatch = GateCumsumConfig::kRowsInFlight;
  const int per_column = blockDim.x / Kp, d = threadIdx.x % Kp;
  if (!gates_a_column(Kp)) return;
  gate.with_activation([&](auto activation) {
    for (int r0 = threadIdx.x / Kp; r0 < C; r0 += kBatch * per_column) {
      float a[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int r = r0 + u * per_column;
        a[u] = r < rows && d < K ? to_float(g[r * ld_g + d]) : 0.f;
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int r = r0 + u * per_column;
        const float a_t = activation(a[u]);  // computed for every row: no branch around the SFU chain
        if (r < C) x[r * ld_x + d] = r < rows && d < K ? a_t : 0.f;
      }
    }
  });
}

// P and A of a chunk of l rows: P stored (p_states_dtype into ws.P, fp32 into saved_P when set) at
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
  const bool paired = pairs_aligned(p.ws.P, p.ws.p_states_dtype, stride);
  const bool saved_paired = pairs_aligned(p.saved_P, DType::kF32, stride);
  auto store_p = [&](int r, int i, float2 x) {  // P[r, i:i + 2], i even
    const int64_t at = first + r * stride + i;
    store_pair(p.ws.P, p.ws.p_states_dtype, at, x, true, paired);
    if (p.saved_P != nullptr) store_pair(p.saved_P, DType::kF32, at, x, true, saved_paired);
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

// T = (I + A)^-1 of the chunk's live sub-chunks in T's tile, from A's live blocks on and below the
// diagonal (A's tile): each diagonal block by forward substitution (lane i of a half-warp owns
// column i in registers), then the blocks below it (invert_below_diagonal); the blocks above the
// diagonal zero.
template <Products kP, typename In, bool kScaled>
__device__ __forceinline__ void invert(const IntraTiles<In, kScaled>& tiles, int C, int live) {
  using Config = IntraConfig<In>;
  constexpr int kSub = Config::kSub, kWarps = Config::kWarps;
  const int ldc = tiles.ldc, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* T = tiles.T;
  // The zeros above the diagonal blocks, four columns a store, by the warps that hold no diagonal
  // block (two to a warp below).
  const int solving = ceil_div(live, 2) * 32;
  for (int x = static_cast<int>(threadIdx.x) - solving; x >= 0 && x < live * kSub * (C / 4);
       x += static_cast<int>(blockDim.x) - solving) {
    const int r = x / (C / 4), i = 4 * (x % (C / 4));
    if (i >= (r / kSub + 1) * kSub) store4(T + r * ldc + i, float4{0.f, 0.f, 0.f, 0.f});
  }
  for (int b = warp * 2 + lane / kSub, i = lane % kSub; b < live; b += 2 * kWarps) {
    const float* a = tiles.A + b * kSub * (ldc + 1);
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
  invert_below_diagonal<kP == Products::kTf32, kWarps>(tiles.A, T, tiles.Y, ldc, live);
}

// kScaled: use_qk_l2norm_in_kernel (IntraTiles).
template <Products kP, typename In, typename Dims, bool kRecompute, bool kScaled>
__global__ void __launch_bounds__(IntraConfig<In>::kThreads, IntraConfig<In>::template min_blocks<Dims>())
    fwd_intra_kernel(const __grid_constant__ ForwardParams p) {
  using Config = IntraConfig<In>;
  constexpr int kSub = Config::kSub, kWarps = Config::kWarps;
  const int64_t chunk = launched_chunk(p, blockIdx.x);
  const ChunkSpan c = chunk_span(p, chunk);
  const int head = blockIdx.y, qk_head = head / (p.HV / p.H);
  const int C = Dims::chunk(p), K = Dims::k(p), V = Dims::v(p), l = static_cast<int>(c.rows);
  const int Kp = Config::padded(K), Vp = Config::padded(V);
  const int live = ceil_div(l, kSub);  // sub-chunks holding tokens
  const IntraLayout<In, kRecompute> L(C, K, V);
  const int ldk = L.ldk, ldv = L.ldv, ldg = L.ldg, ldc = L.ldc;
  extern __shared__ __align__(16) char smem_bytes[];
  In* q = reinterpret_cast<In*>(smem_bytes + L.q);
  In* k = reinterpret_cast<In*>(smem_bytes + L.k);
  float* g = reinterpret_cast<float*>(smem_bytes + L.g);  // a_t (F1's gate), gamma * log2(e), then K_up
  uint16_t* g16 = reinterpret_cast<uint16_t*>(smem_bytes + L.g16);  // a 16-bit g's bits, until the gate reads them
  float* A = reinterpret_cast<float*>(smem_bytes + L.A);
  In* vs = reinterpret_cast<In*>(smem_bytes + L.v);  // once A (k with kRecompute) is dead
  float* T = reinterpret_cast<float*>(smem_bytes + L.T);
  float* Y = reinterpret_cast<float*>(smem_bytes + L.Y);
  float* beta = reinterpret_cast<float*>(smem_bytes + L.beta);
  float* scale_q = reinterpret_cast<float*>(smem_bytes + L.scale_q);
  float* scale_k = reinterpret_cast<float*>(smem_bytes + L.scale_k);
  const IntraTiles<In, kScaled> tiles{q, k, g, A, T, Y, beta, scale_q, scale_k, ldk, ldg, ldc};
  const int tid = threadIdx.x, nthreads = blockDim.x, warp = tid / 32;
  auto row_at = [&](int r) { return (c.first_row + r) * p.HV + head; };  // (token, value head) row
  auto io_at = [&](int r) { return (c.io_row + r) * p.io_HV + head; };  // the same in g, v and beta

  // Rows past the chunk's end and columns past K or V are zero (beta too), so they add nothing.
  const int64_t stride_k = static_cast<int64_t>(p.HV) * K, stride_qk = static_cast<int64_t>(p.io_H) * K;
  const int64_t io_k = static_cast<int64_t>(p.io_HV) * K, io_v = static_cast<int64_t>(p.io_HV) * V;
  const int64_t qk_first = (c.io_row * p.io_H + qk_head) * K;
  const DType g_dtype = p.gate.g_dtype;
  // A 16-bit g takes q's room until F1's first pass has read it; q comes after.
  const bool q_after_gate = g_dtype != DType::kF32;
  auto load_q = [&] {
    if constexpr (Config::kNarrow) {
      copy_rows16_async(q, ldk, static_cast<const In*>(p.q) + qk_first, stride_qk, C, Kp, l, K);
      cp_async_commit();
    } else {
      load_rows_as_float(q, ldk, p.q, p.qk_dtype, qk_first, stride_qk, C, Kp, l, K);
    }
  };
  if (g_dtype == DType::kF32) {
    copy_rows_async(g, ldg, static_cast<const float*>(p.gate.g) + io_at(0) * K, io_k, C, Kp, l, K);
  } else {
    copy_rows16_async(g16, Kp, static_cast<const uint16_t*>(p.gate.g) + io_at(0) * K, io_k, C, Kp, l, K);
  }
  if constexpr (Config::kNarrow) {
    if (!q_after_gate) load_q();
    copy_rows16_async(k, ldk, static_cast<const In*>(p.k) + qk_first, stride_qk, C, Kp, l, K);
  }
  cp_async_commit();
  {  // v and beta (and the stored T), loaded later: asked into L2 first
    const int v_size = element_bytes(p.v_dtype), beta_size = element_bytes(p.beta_dtype);
    prefetch_rows_l2(static_cast<const char*>(p.v) + io_at(0) * V * v_size, v_size * io_v, l, v_size * V);
    for (int r = tid; r < l; r += nthreads) prefetch_l2(static_cast<const char*>(p.beta) + io_at(r) * beta_size);
    if constexpr (kRecompute) prefetch_rows_l2(p.ws.T + io_at(0) * C, 4 * p.io_HV * C, l, 4 * C);
  }
  if constexpr (!Config::kNarrow) {
    if (q_after_gate) load_rows_as_float(k, ldk, p.k, p.qk_dtype, qk_first, stride_qk, C, Kp, l, K);
    else load_rows_as_float<2>({{q, k}}, ldk, {{p.q, p.k}}, p.qk_dtype, qk_first, stride_qk, C, Kp, l, K);
  }
  for (int r = tid; r < C; r += nthreads) {
    beta[r] = r < l ? activate_beta(p.beta_mode, load_float(p.beta, p.beta_dtype, io_at(r))) : 0.f;
  }
  // The gate of this thread's column in F1's first pass, loaded while the copies are in flight.
  const ColumnGate gate = gates_a_column(Kp) ? column_gate(p.gate, head, head * K + min(tid % Kp, K - 1)) : ColumnGate{};
  cp_async_wait<0>();
  __syncthreads();
  // F1 (kda-math.md 3.3), in two passes: the gate of every element into g's tile, then its cumsum.
  if (g_dtype == DType::kBF16) {
    gate_rows(reinterpret_cast<const __nv_bfloat16*>(g16), Kp, g, ldg, C, l, K, Kp, gate);
  } else if (g_dtype == DType::kF16) {
    gate_rows(reinterpret_cast<const __half*>(g16), Kp, g, ldg, C, l, K, Kp, gate);
  } else {
    gate_rows(g, ldg, g, ldg, C, l, K, Kp, gate);
  }
  __syncthreads();
  if (q_after_gate) load_q();
  // gamma, the cumsum of each column in row order as F1 alone sums it: in log2 units in place, and as
  // is for the backward's stages (gamma, and gamma_L for the state passes). Its last row, which every
  // K_down row reads, also goes to the scratch Y (at least Kp floats: (C / 16 - 1) 256 >= Kp for the
  // chunk sizes 32 and 64 and K <= 128 that Problem and check_supported admit), which the inverse
  // takes only once K_down is formed.
  float* g_last = Y;
  for (int d = tid; d < K; d += nthreads) {
    float* gamma = p.ws.gamma != nullptr ? p.ws.gamma + row_at(0) * K + d : nullptr;
    const float total = scan_column(g + d, l, ldg, [](float a) { return a; }, [&](int64_t r, float sum) {
      g[r * ldg + d] = sum * kLog2e;
      if (gamma != nullptr) gamma[r * stride_k] = sum;
    });
    p.ws.g_last[(chunk * p.HV + head) * K + d] = total;
    g_last[d] = total * kLog2e;
  }
  for (int d = K + tid; d < Kp; d += nthreads) g_last[d] = 0.f;
  if (q_after_gate) {
    cp_async_wait<0>();
    __syncthreads();
  }
  if constexpr (kScaled) {
    row_scales(q, l, C, K, ldk, scale_q);
    row_scales(k, l, C, K, ldk, scale_k);
  }
  __syncthreads();
  const bool vector = K % 4 == 0;  // aligned global rows of K floats (of K bf16 operands: 8 bytes)
  if (p.ws.beta_act != nullptr) {  // the backward's recompute keeps what its stages read again
    for (int r = tid; r < l; r += nthreads) p.ws.beta_act[row_at(r)] = beta[r];
    // The row scales, by the first value head of each query/key head (the others compute the same).
    if (kScaled && p.ws.scale_q != nullptr && head % (p.HV / p.H) == 0) {
      for (int r = tid; r < l; r += nthreads) {
        const int64_t at = (c.first_row + r) * p.H + qk_head;
        p.ws.scale_q[at] = scale_q[r];
        p.ws.scale_k[at] = scale_k[r];
      }
    }
  }

  auto load_v = [&] {  // into A's room once A is dead (k's with kRecompute)
    if constexpr (Config::kNarrow) {
      copy_rows16_async(vs, ldv, static_cast<const In*>(p.v) + io_at(0) * V, io_v, C, Vp, l, V);
      cp_async_commit();
    } else {
      load_rows_as_float(vs, ldv, p.v, p.v_dtype, io_at(0) * V, io_v, C, Vp, l, V);
    }
  };
  // T diag(beta) in place, stored as an operand: U = (T diag(beta)) V, then W = (T diag(beta)) K_up.
  auto scale_T_columns = [&] {
    for_each_cell<4>(C, C / 4, 0, ldc, [&](int, int i, int64_t, int s) {
      store4(T + s, map4([](float x, float b) { return as_operand<kP>(x * b); }, load4(T + s), load4(beta + i)));
    });
  };
  // Warp tasks are (row tile, 32 columns); row tile R reads T's columns below 16 (R + 1) only (T is
  // lower triangular). W, K_down and Q_up are stored as operands of the state passes' products
  // (Operand<kP>).
  using Op = Operand<kP>;
  auto product = [&](int width, void* out, DType dtype, auto b) {
    const int groups = ceil_div(width, 32);
    const bool paired = pairs_aligned(out, dtype, width);
    for (int task = warp; task < live * groups; task += kWarps) {
      const int R0 = task / groups * kSub, c0 = task % groups * 32;
      float acc[4][4] = {};
      // Operands TF32 holds exactly: T and K_up stored rounded, v of 16 bits (kTf32 takes bfloat16).
      warp_mma<kP, 4, Config::kNarrow>(acc, 0, R0 + kSub, [&](int r, int i) { return T[(R0 + r) * ldc + i]; },
                                       [&](int i, int e) { return c0 + e < width ? b(i, c0 + e) : 0.f; });
      for_each_acc_pair(acc, [&](int r, int e, float2 pair) {
        if (R0 + r < l && c0 + e < width) {
          store_pair(out, dtype, row_at(R0 + r) * width + c0 + e, pair, c0 + e + 1 < width, paired);
        }
      });
    }
  };
  auto product_U = [&] { product(V, p.ws.U, DType::kF32, [&](int i, int e) { return to_float(vs[i * ldv + e]); }); };
  auto product_W = [&] { product(K, p.ws.W, kOperandDType<kP>, [&](int i, int e) { return g[i * ldg + e]; }); };
  // Q_up = q_hat exp(gamma) and K_down = k_hat exp(gamma_L - gamma) stored (kStored), K_up = k_hat
  // exp(gamma) in place of gamma as an operand (kUp), by `threads` threads.
  Op* q_up = reinterpret_cast<Op*>(p.ws.q_up) + row_at(0) * K;
  Op* k_down = reinterpret_cast<Op*>(p.ws.k_down) + row_at(0) * K;
  auto form_operands = [&](auto stored, auto up_in_place, int thread, int threads) {
    constexpr bool kStored = decltype(stored)::value, kUp = decltype(up_in_place)::value;
    for_each_cell_of<4>(thread, threads, kUp ? C : l, Kp / 4, stride_k, ldg, [&](int r, int d, int64_t at, int s) {
      const float4 gr = load4(g + s), kr = tiles.k4(r, d);
      const float4 up = map4([](float x) { return exp2_fast(x); }, gr);
      if (kStored && r < l) {
        store_first(q_up + at, map4([](float qx, float u) { return qx * u; }, tiles.q4(r, d), up), K - d, vector);
        const float4 down = map4([](float kx, float last, float gx) { return kx * exp2_fast(last - gx); }, kr,
                                 load4(g_last + d), gr);
        store_first(k_down + at, down, K - d, vector);
      }
      if constexpr (kUp) store4(g + s, map4([](float kx, float u) { return as_operand<kP>(kx * u); }, kr, up));
    });
  };

  if constexpr (kRecompute) {
    form_operands(std::true_type{}, std::true_type{}, tid, nthreads);
    __syncthreads();
    // q and k are dead: T as stored (rows of the inputs as given, its rows past l zero) into q's
    // room, v into k's.
    copy_rows_async(T, ldc, p.ws.T + io_at(0) * C, static_cast<int64_t>(p.io_HV) * C, C, C, l, C);
    cp_async_commit();
    load_v();
    cp_async_wait<0>();
    __syncthreads();
    scale_T_columns();
    __syncthreads();
    product_U();
    product_W();
  } else {
    // Q_up and K_down by the warps that P and A leave first; then q is dead and A takes its room.
    p_and_a<kP>(p, tiles, C, Kp, l, row_at(0) * C, [&](int thread, int threads) {
      form_operands(std::true_type{}, std::false_type{}, thread, threads);
    });
    form_operands(std::false_type{}, std::true_type{}, tid, nthreads);
    __syncthreads();
    // k and gamma are dead: T in k's room, then v in A's once T is formed.
    invert<kP>(tiles, C, live);
    load_v();
    if (p.ws.T != nullptr) store_rows(p.ws.T + row_at(0) * C, static_cast<int64_t>(p.HV) * C, T, ldc, l, C);
    __syncthreads();
    scale_T_columns();
    __syncthreads();
    product_W();
    cp_async_wait<0>();
    __syncthreads();
    product_U();
  }
}

}  // namespace fkt::cuda
