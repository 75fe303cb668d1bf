// F4 on CUDA for bf16 products at the common shape (C = 64, K = V = 128), the state held transposed
// in registers, so that every product takes its fp32 operand from registers (wgmma's A, "RS") and
// reads only the chunk's bf16 operands from shared memory, where TMA puts them. One warpgroup per
// (sequence, value head, 64-column V-tile), walking the chunks in order:
// - S^T [64 value columns, K] (fp32, registers: warp w holds value columns 16w .. 16w + 15) is the
//   accumulator of delta^T K_down (B = K_down, MN-major as its rows are stored);
// - the new values, in one of two ways (kda-math.md section 3: U - W S = T diag(beta) (V - K_up S)):
//   - from T (kNewValuesFromT, F5 inside, where the forward runs whole: ws.values_from_t): X^T =
//     v^T - S^T K_up^T (B = K_up, K-major, in W's place), its columns scaled by beta, then delta^T =
//     (beta X)^T T^T (B = T's rows, K-major), so that F2 stores neither W nor U;
//   - from U: delta^T = U^T - S^T W^T (B = W, K-major), U^T read from its tile into the
//     accumulator;
// - A = S^T, beta X^T and delta^T in two bf16 parts each (hi + lo, a_fragment), and T as two bf16
//   arrays split from its fp32 rows in shared memory: a sum holds the fp32 operand to 2^-17 (a TF32
//   operand keeps 2^-11), with no copy of S or delta through shared memory, and each product reads
//   its B operand once (T's parts: hi by both parts of beta X, lo by the hi part).
// - F5 may run inside the pass (Stored = void): o^T = s S^T Q_up^T + delta^T P^T (S's hi part, the
//   bf16 states that fwd_output reads), o leaving in bf16; else (Stored = __half) the states leave
//   in fp16 with a scale per row of the tile (common/scaled_half.cuh) and delta in fp32, rounded
//   to TF32 (tf32_rounded: bwd_wy_inter's TF32 wgmma products read it as it is). Each leaves in
//   whole rows of the tile from shared memory.
// One thread issues the copies: the next chunk's W or K_up, U or v and T, gamma_L (and Q_up) once
// this chunk's have been read, its K_down (and P) once this chunk's update has run, each group on
// its mbarrier.
#pragma once

#include <type_traits>

#include <cuda.h>

#include "cuda/common/activation.cuh"
#include "cuda/common/convert.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/scaled_half.cuh"
#include "cuda/common/tile_copy.cuh"
#include "cuda/common/tma.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/sm90/dims.hpp"
#include "cuda/sm90/forward/chunks.cuh"
#include "cuda/sm90/forward/intermediate_states.cuh"
#include "cuda/sm90/forward/wgmma_state_block.cuh"

namespace fkt::cuda {

// The pass's arguments: the forward's, and tensor maps (row_tensor_map in sm90/tensor_map.hpp) of
// the workspace rows it reads, boxes of 64 tokens.
struct FwdStateWgmmaParams {
  ForwardParams p;
  CUtensorMap w, k_down;  // W (K_up from T), K_down [B*T, HV, K] bf16
  CUtensorMap u;          // from U: U [B*T, HV, V] fp32
  CUtensorMap v, T;       // from T: v [B*T, HV, V] bf16 (the input), T [B*T, HV, C] fp32
  CUtensorMap q_up, P;    // with F5 inside: Q_up [B*T, HV, K], P [B*T, HV, C] bf16
  // A forward in time slices (forward/pieces.hpp), slice z of a block passed in: `slices` slices
  // (none: 0) of p.piece_end chunks of each sequence (p.piece_begin 0), the states entering slices 1
  // on, each like initial_state; with SliceSummary, the summaries out.
  int64_t slices;
  const float* slice_states;
  float* summaries;
};

// The pass's variant that writes the summary of each time slice but the last (forward/pieces.hpp):
// the affine map of the state entering the slice onto the state leaving it, [K, V + K] per (slice,
// sequence, value head) of fp32 summaries [slices - 1, N, HV, K, V + K] (the layout of the
// context-parallel summaries, which the fold reads): the slice's state from zero in columns 0 .. V - 1,
// and from the identity with U = 0 in columns V .. V + K - 1. Nothing else is stored.
struct SliceSummary {};

// Shared memory, byte offsets from a 1024-byte aligned base: TMA boxes of 64 rows x 128 bytes,
// W or K_up, K_down (and Q_up) in two column halves; from U, U in two boxes of 32 columns; from T, v
// in one, T in two of 32 fp32 columns and its hi and lo parts in one each (Swizzled128, K-major);
// with F5 inside, P in one; the tiles on their way to global memory: with F5 inside o [C, 64] bf16,
// with the states delta [C, 64] and the state [K, 64] fp32 (SwizzledByRow), the state unrounded;
// gamma_L [K] as copied, exp(gamma_L) [K], from T beta [C], two mbarriers. About 107 KB with F5
// inside from T (82 KB from U), 98 KB with the states, 49 KB for the summaries: two blocks per SM.
template <typename Stored, bool kNewValuesFromT = false>
struct FwdStateWgmmaLayout {
  static constexpr bool kOutput = std::is_void_v<Stored>, kStates = std::is_same_v<Stored, __half>;
  static constexpr bool kFromT = kNewValuesFromT;
  static_assert(!kFromT || kOutput, "from T with F5 inside only");
  static constexpr int kC = 64, kK = 128, kTile = 64, kThreads = 128, kBox = 64 * 128;
  using Rows16 = SwizzledByRow<kTile / 8, __nv_bfloat16>;
  using Rows32 = SwizzledByRow<kTile / 4, float>;
  static constexpr int w = 0, kd = w + 2 * kBox, values = kd + 2 * kBox;
  static constexpr int u = values, v = values, t = v + kBox, t_hi = t + 2 * kBox, t_lo = t_hi + kBox;
  static constexpr int qu = kFromT ? t_lo + kBox : u + 2 * kBox;
  static constexpr int pm = qu + (kOutput ? 2 * kBox : 0), out = pm + (kOutput ? kBox : 0);
  static constexpr int states = out + (kOutput ? 2 : kStates ? 4 : 0) * kC * kTile;
  static constexpr int g_last = states + (kStates ? 4 * kK * kTile : 0), decay = g_last + 4 * kK;
  static constexpr int beta = decay + 4 * kK, bars = beta + (kFromT ? 4 * kC : 0), bytes = bars + 16;
  static constexpr int kAlign = 1024, launch_bytes = bytes + kAlign;  // room to align the base
  // The expected bytes of the two copy groups (from T: less v's box where the tile has no v).
  static constexpr uint32_t kValueBytes = (kFromT ? 5 : 4) * kBox + (kOutput ? 2 * kBox : 0) + 4 * kK;
  static constexpr uint32_t kUpdateBytes = (kOutput ? 3 : 2) * kBox;
};

// Stored: void, F5 inside the pass (ws.output_in_state_pass); __half, the states in fp16 with row
// scales and delta in fp32 (the backward's layout, ws.half_states); SliceSummary. kNewValuesFromT:
// with F5 inside, the new values from T (ws.values_from_t).
// The block's work in time slice `slice` (0 without slices), for fwd_state_wgmma_kernel and for
// the backward's state_passes_kernel; params: a kernel parameter (its tensor maps are read by TMA
// where they are).
template <typename Stored, bool kNewValuesFromT = false>
__device__ __forceinline__ void fwd_state_wgmma(const FwdStateWgmmaParams& params, int64_t slice) {
  using L = FwdStateWgmmaLayout<Stored, kNewValuesFromT>;
  constexpr bool kOutput = L::kOutput, kStates = L::kStates, kFromT = L::kFromT;
  constexpr bool kSummary = std::is_same_v<Stored, SliceSummary>;
  static_assert(kOutput || kStates || kSummary, "o, the states and delta, or the slices' summaries");
  constexpr int kThreads = L::kThreads, C = L::kC, K = L::kK, kTile = L::kTile, kBox = L::kBox;
  constexpr int V = CommonDims::v(ForwardParams{});
  static_assert(CommonDims::chunk(ForwardParams{}) == C && CommonDims::k(ForwardParams{}) == K, "the common shape");
  static_assert(kTile == kStateScaleCols, "a scale per row of the tile (store_scaled_half_rows)");
  const ForwardParams& p = params.p;
  const WgmmaStateBlock<kTile, kSummary ? V + K : V> b(p);
  // A summary's tiles past V map the entering state: no U or v (zero), the identity to start from.
  const bool reads_values = !kSummary || b.e0 < V;
  const int v0 = 16 * static_cast<int>(threadIdx.x / 32);  // the warp's first value column in the tile
  const bool leader = threadIdx.x == 0;
  extern __shared__ __align__(1024) char smem_raw[];
  char* const smem = align_shared<L::kAlign>(smem_raw);
  uint64_t* const values_ready = reinterpret_cast<uint64_t*>(smem + L::bars);
  uint64_t* const update_ready = values_ready + 1;
  const float* const g_last = reinterpret_cast<const float*>(smem + L::g_last);
  float* const decay = reinterpret_cast<float*>(smem + L::decay);
  float* const beta = reinterpret_cast<float*>(smem + L::beta);
  // Chunk j's rows start at token row first_row + j C of the maps' [B*T, HV, .] tensors; rows past
  // its end belong to the next sequence (or read as zero past the tensor): delta's columns there are
  // zeroed below, and so are K_down's rows; o's columns there are not stored.
  auto issue_values = [&](int64_t j) {
    mbarrier_expect_bytes(values_ready, reads_values ? L::kValueBytes : L::kValueBytes - (kFromT ? 1 : 2) * kBox);
    for (int h = 0; h < 2; ++h) {
      tma_load(smem + L::w + h * kBox, params.w, values_ready, 64 * h, b.head, b.token(j));
      if constexpr (kFromT) {
        tma_load(smem + L::t + h * kBox, params.T, values_ready, 32 * h, b.head, b.token(j));
      } else if (reads_values) {
        tma_load(smem + L::u + h * kBox, params.u, values_ready, b.e0 + 32 * h, b.head, b.token(j));
      }
      if constexpr (kOutput) tma_load(smem + L::qu + h * kBox, params.q_up, values_ready, 64 * h, b.head, b.token(j));
    }
    if (kFromT && reads_values) tma_load(smem + L::v, params.v, values_ready, b.e0, b.head, b.token(j));
    bulk_load(smem + L::g_last, p.ws.g_last + (b.first_state + j * p.HV) * K, 4 * K, values_ready);
  };
  auto issue_update = [&](int64_t j) {
    mbarrier_expect_bytes(update_ready, L::kUpdateBytes);
    for (int h = 0; h < 2; ++h) {
      tma_load(smem + L::kd + h * kBox, params.k_down, update_ready, 64 * h, b.head, b.token(j));
    }
    if constexpr (kOutput) tma_load(smem + L::pm, params.P, update_ready, 0, b.head, b.token(j));
  };
  // U^T or v^T of the chunk from its tile (value column v0 + r, chunk row col): under the 128-byte
  // swizzle a warp's reads hit 32 (U) or 16 (v, two lanes a word) different banks.
  auto load_values = [&](float(&acc)[C / 8][4]) {
    if (!reads_values) return transform_acc(acc, [](int, int, float) { return 0.f; });
    transform_acc(acc, [&](int r, int col, float) {
      const int e = v0 + r;
      if constexpr (kFromT) {
        return to_float(*reinterpret_cast<const __nv_bfloat16*>(smem + L::v + col * 128 + ((e / 8) ^ (col % 8)) * 16 +
                                                                 e % 8 * 2));
      }
      const int x = e % 32;
      return *reinterpret_cast<const float*>(smem + L::u + e / 32 * kBox + col * 128 + ((x / 4) ^ (col % 8)) * 16 +
                                             x % 4 * 4);
    });
  };
  // T's fp32 rows (two boxes of 32 columns) as its hi and lo parts (split_bf16x2), cell c of row r
  // at c ^ (r % 8) as a TMA box of its 64 bf16 would put it: delta's B operand.
  auto split_T = [&] {
    for (int x = threadIdx.x; x < C * 8; x += kThreads) {
      const int r = x / 8, c = x % 8, from = 2 * (c % 4);
      const char* row = smem + L::t + c / 4 * kBox + r * 128;
      const float4 first = *reinterpret_cast<const float4*>(row + (from ^ (r % 8)) * 16);
      const float4 second = *reinterpret_cast<const float4*>(row + ((from + 1) ^ (r % 8)) * 16);
      const SplitBf16x2 e[4] = {
          split_bf16x2(make_float2(first.x, first.y)), split_bf16x2(make_float2(first.z, first.w)),
          split_bf16x2(make_float2(second.x, second.y)), split_bf16x2(make_float2(second.z, second.w))};
      const int at = r * 128 + (c ^ (r % 8)) * 16;
      *reinterpret_cast<uint4*>(smem + L::t_hi + at) = make_uint4(e[0].hi, e[1].hi, e[2].hi, e[3].hi);
      *reinterpret_cast<uint4*>(smem + L::t_lo + at) = make_uint4(e[0].lo, e[1].lo, e[2].lo, e[3].lo);
    }
  };

  // The state entering the block's chunks: a later slice's from the scan over the summaries, else
  // the initial state (a piece's: the carry).
  const int64_t state_elements = p.N * p.io_HV * static_cast<int64_t>(K) * V;
  const float* const entering = slice > 0 ? params.slice_states + (slice - 1) * state_elements : p.initial_state;
  // S^T: value column v0 + r, state row 64h + col of s[h].
  float s[2][8][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    transform_acc(s[h], [&](int r, int col, float) {
      if constexpr (kSummary) return b.e0 + v0 + r - V == 64 * h + col ? 1.f : 0.f;
      return entering != nullptr ? entering[state_index(p, b.n, b.head, 64 * h + col, b.e0 + v0 + r)] : 0.f;
    });
  }
  if (leader) {
    mbarrier_init(values_ready);
    mbarrier_init(update_ready);
  }
  __syncthreads();
  // The block's chunks: all the sequence's (piece_end kNoPieceEnd, slice 0), a piece's, or slice z's,
  // the slices' span being the first piece's.
  const int64_t span = p.piece_end - p.piece_begin;
  const int64_t begin = p.piece_begin + slice * span, end = min(b.chunks, begin + span);
  if (leader && begin < end) {
    issue_values(begin);
    issue_update(begin);
  }
  // The state into a tensor like the initial state (a time segment's start, or the final state).
  auto store_state = [&](float* to) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      for_each_acc(s[h], [&](int r, int col, float x) { to[state_index(p, b.n, b.head, 64 * h + col, b.e0 + v0 + r)] = x; });
    }
  };
  // From T, the beta of chunk j's row `row` (thread row < C), loaded a chunk ahead as raw bits:
  // its global load waited for inside the chunk's step took a tenth of the pass's stall samples.
  const int row = static_cast<int>(threadIdx.x);
  auto beta_bits_of = [&](int64_t j) -> uint64_t {
    if (!kFromT || j >= end || row >= b.rows_of(j)) return 0;
    return load_bits(p.beta, p.beta_dtype, (b.io_token(j) + int64_t{row}) * p.io_HV + b.head);
  };
  uint64_t beta_bits = beta_bits_of(begin);
  int64_t segment_start = kSummary ? -1 : first_segment_start(p, begin);
  for (int64_t j = begin; j < end; ++j) {
    const int l = b.rows_of(j);
    const uint32_t parity = static_cast<uint32_t>((j - begin) & 1);
    char* const ops = unhoisted(smem);  // the products' operands
    const int64_t base = (b.first_state + j * p.HV) * K * V;  // h_j's [K, V] block
    if (j == segment_start) {
      store_state(segment_states_at(p, j));
      segment_start += p.segment_chunks;
    }
    if (!kSummary && p.intermediate_states != nullptr) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        for_each_acc(s[h], [&](int r, int col, float x) { store_intermediate(p, base, 64 * h + col, b.e0 + v0 + r, x); });
      }
    }
    if constexpr (kStates) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        for_each_acc(s[h], [&](int r, int col, float x) {
          *reinterpret_cast<float*>(smem + L::states + L::Rows32::at(64 * h + col, v0 + r)) = x;
        });
      }
    }
    mbarrier_wait(values_ready, parity);
    decay[threadIdx.x] = expf(g_last[threadIdx.x]);
    // d: X^T = v^T - S^T K_up^T (from T) or delta^T = U^T - S^T W^T, then o^T = S^T Q_up^T on S's hi
    // part.
    float d[C / 8][4];
    load_values(d);
    SplitFragment a[K / 16];
#pragma unroll
    for (int ks = 0; ks < K / 16; ++ks) a[ks] = a_fragment(s[ks / 4], ks % 4);
    float o[kTile / 8][4] = {};
    pin_accumulator(d);
    if constexpr (kOutput) pin_accumulator(o);
    wgmma_fence();
    // k-step ks of W (K_up) and Q_up: 32 bytes into the rows of column half ks / 4.
    auto k_step = [&](int ks) { return ks / 4 * kBox + ks % 4 * 32; };
    const uint64_t w = Swizzled128::k_major(ops + L::w);
#pragma unroll
    for (int ks = 0; ks < K / 16; ++ks) {
      wgmma_bf16_rs<-1, 0>(d, a[ks].hi, Swizzled128::plus(w, k_step(ks)));
      wgmma_bf16_rs<-1, 0>(d, a[ks].lo, Swizzled128::plus(w, k_step(ks)));
    }
    if constexpr (kOutput) {
      const uint64_t qu = Swizzled128::k_major(ops + L::qu);
#pragma unroll
      for (int ks = 0; ks < K / 16; ++ks) wgmma_bf16_rs<1, 0>(o, a[ks].hi, Swizzled128::plus(qu, k_step(ks)));
    }
    wgmma_commit();  // one group: both products are waited for before the next chunk's copies
    SplitFragment da[C / 16];
    if constexpr (kFromT) {
      split_T();
      fence_proxy_async_shared();
      if (row < C) beta[row] = row < l ? activate_beta(p.beta_mode, from_bits(beta_bits, p.beta_dtype)) : 0.f;
      beta_bits = beta_bits_of(j + 1);
      wgmma_wait();  // the copies of the next chunk may land where these products read
      pin_accumulator(d);
      if constexpr (kOutput) pin_accumulator(o);
    } else {
      wgmma_wait();  // the copies of the next chunk may land where these products read
      pin_accumulator(d);
      if constexpr (kOutput) pin_accumulator(o);
      if (l < C) transform_acc(d, [&](int, int col, float x) { return col < l ? x : 0.f; });
#pragma unroll
      for (int ks = 0; ks < C / 16; ++ks) da[ks] = a_fragment(d, ks);
      if constexpr (kStates) {
        for_each_acc(d, [&](int r, int col, float x) {
          *reinterpret_cast<float*>(smem + L::out + L::Rows32::at(col, v0 + r)) = tf32_rounded(x);
        });
      }
    }
    // W or K_up, U or v and T, gamma_L (and Q_up) are consumed; exp(gamma_L) is in (from T: T's parts
    // and beta; with the states: h_j and delta staged)
    __syncthreads();
    if (leader && j + 1 < end) issue_values(j + 1);
    if constexpr (kFromT) {  // delta^T = (beta X)^T T^T, X^T's columns past the chunk's end zero
      transform_acc(d, [&](int, int col, float x) { return col < l ? beta[col] * x : 0.f; });
      SplitFragment bx[C / 16];
#pragma unroll
      for (int ks = 0; ks < C / 16; ++ks) bx[ks] = a_fragment(d, ks);
      transform_acc(d, [](int, int, float) { return 0.f; });
      pin_accumulator(d);
      wgmma_fence();
      const uint64_t t_hi = Swizzled128::k_major(ops + L::t_hi), t_lo = Swizzled128::k_major(ops + L::t_lo);
#pragma unroll
      for (int ks = 0; ks < C / 16; ++ks) {
        wgmma_bf16_rs<1, 0>(d, bx[ks].hi, Swizzled128::plus(t_hi, ks * 32));
        wgmma_bf16_rs<1, 0>(d, bx[ks].lo, Swizzled128::plus(t_hi, ks * 32));
        wgmma_bf16_rs<1, 0>(d, bx[ks].hi, Swizzled128::plus(t_lo, ks * 32));
      }
      wgmma_commit();
    }
    // S^T <- S^T diag(exp(gamma_L)) + delta^T K_down (and o^T += delta^T P^T).
#pragma unroll
    for (int h = 0; h < 2; ++h) transform_acc(s[h], [&](int, int col, float x) { return decay[64 * h + col] * x; });
    mbarrier_wait(update_ready, parity);
    if (l < C) {  // K_down's rows past the chunk's end, which the update would add
      zero_box_rows<kThreads, C>(smem + L::kd, 2, l);
      fence_proxy_async_shared();
      __syncthreads();
    }
    if constexpr (kFromT) {  // delta's columns past the chunk's end (T's rows there) zero
      wgmma_wait();
      pin_accumulator(d);
      if (l < C) transform_acc(d, [&](int, int col, float x) { return col < l ? x : 0.f; });
#pragma unroll
      for (int ks = 0; ks < C / 16; ++ks) da[ks] = a_fragment(d, ks);
    }
    if constexpr (kOutput) {  // o^T = s S^T Q_up^T
      pin_accumulator(o);
      transform_acc(o, [&](int, int, float x) { return p.scale * x; });
    }
    pin_accumulator(s[0]);
    pin_accumulator(s[1]);
    wgmma_fence();
    const uint64_t kd = Swizzled128::mn_major(ops + L::kd);
#pragma unroll
    for (int ks = 0; ks < C / 16; ++ks) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // rows 16 ks onwards of column half h
        wgmma_bf16_rs<1, 1>(s[h], da[ks].hi, Swizzled128::plus(kd, h * kBox + 16 * ks * 128));
        wgmma_bf16_rs<1, 1>(s[h], da[ks].lo, Swizzled128::plus(kd, h * kBox + 16 * ks * 128));
      }
    }
    if constexpr (kOutput) {
      const uint64_t pm = Swizzled128::k_major(ops + L::pm);
#pragma unroll
      for (int ks = 0; ks < C / 16; ++ks) {
        wgmma_bf16_rs<1, 0>(o, da[ks].hi, Swizzled128::plus(pm, ks * 32));
        wgmma_bf16_rs<1, 0>(o, da[ks].lo, Swizzled128::plus(pm, ks * 32));
      }
    }
    wgmma_commit();
    if constexpr (kStates) {  // while the products run: h_j and delta in whole rows
      store_scaled_half_rows<kThreads, K>(static_cast<__half*>(p.ws.states) + base + b.e0, V,
                                          p.ws.state_scales + state_scales_at(b.first_state + j * p.HV, b.e0, V, K),
                                          smem + L::states, L::Rows32::cell);
      store_cells16<kThreads, C, kTile / 4>(p.ws.delta + (b.first + j * b.step) * V + b.e0, 4 * p.HV * V,
                                            smem + L::out, l, L::Rows32::cell);
    }
    wgmma_wait();
    pin_accumulator(s[0]);
    pin_accumulator(s[1]);
    if constexpr (kOutput) {  // o's rows staged (the tile's previous reads ended a barrier ago)
      pin_accumulator(o);
      for_each_acc(o, [&](int r, int col, float x) {
        *reinterpret_cast<__nv_bfloat16*>(smem + L::out + L::Rows16::at(col, v0 + r)) = __float2bfloat16_rn(x);
      });
    }
    __syncthreads();  // K_down (and P, exp(gamma_L)) are consumed (and o's rows are in)
    if (leader && j + 1 < end) issue_update(j + 1);
    if constexpr (kOutput) {
      if (p.o != nullptr) {
        store_cells16<kThreads, C, kTile / 8>(static_cast<__nv_bfloat16*>(p.o) + (b.first + j * b.step) * V + b.e0,
                                              2 * p.HV * V, smem + L::out, l, L::Rows16::cell);
      }
    }
  }
  if constexpr (kSummary) {  // row d of the map: columns 0 .. V + K - 1
    float* const to = params.summaries + ((slice * p.N + b.n) * p.io_HV + b.head) * static_cast<int64_t>(K) * (V + K);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      for_each_acc(s[h], [&](int r, int col, float x) { to[(64 * h + col) * (V + K) + b.e0 + v0 + r] = x; });
    }
  } else if (p.final_state != nullptr && slice + 1 >= params.slices) {
    store_state(p.final_state);
  }
}

// Grid z: the time slice (FwdStateWgmmaParams::slices), 0 without.
template <typename Stored, bool kNewValuesFromT>
__global__ void __launch_bounds__(FwdStateWgmmaLayout<Stored, kNewValuesFromT>::kThreads, 2)
    fwd_state_wgmma_kernel(const __grid_constant__ FwdStateWgmmaParams params) {
  fwd_state_wgmma<Stored, kNewValuesFromT>(params, blockIdx.z);
}

}  // namespace fkt::cuda
