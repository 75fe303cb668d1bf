// F4 on CUDA for bf16 products at the common shape (C = 64, K = V = 128): fwd_state's pass with its
// two products on wgmma (common/wgmma.cuh), one block of two warpgroups per (sequence, value head,
// kTile-column V-tile, kTile = 32 or 64: with_wgmma_state_tile), walking the chunks in order:
// - S (fp32, registers) is the accumulator of K_down^T delta: warpgroup h holds state rows 64h ..
//   64h + 63 at all kTile columns (A = K_down^T, MN-major as K_down's rows are stored).
// - delta = U - W S: warpgroup h computes columns kTile / 2 h onwards (A = W, K-major).
// - The B operands S and delta go to shared memory MN-major, each split in two bf16 parts (hi + lo,
//   split_bf16x2) that take one product each: the sum holds the fp32 operand to 2^-17, where
//   fwd_state's mma.sync pass rounds it to TF32 (2^-11). W and K_down are bf16 as stored.
// - The states and delta leave in whole rows of 16-byte stores from shared memory (bf16 states are
//   S's hi part), not as the accumulator's scattered pairs: the pass is bound by L2 traffic.
// - F5 may run inside the pass (Stored = void, below): o leaves, the states and delta stay.
// The next chunk's W is copied in while the state is updated, and its K_down while delta is
// computed (cp.async), as in fwd_state; its U goes straight to registers.
#pragma once

#include <type_traits>

#include "cuda/common/convert.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/tile_copy.cuh"
#include "cuda/common/vec4.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/sm90/dims.hpp"
#include "cuda/sm90/forward/chunks.cuh"
#include "cuda/sm90/forward/state_config.hpp"
#include "cuda/sm90/forward/wgmma_state_block.cuh"

namespace fkt::cuda {

// Shared memory of a kTile-column V-tile, byte offsets: W [C, K] K-major and K_down^T [K, C]
// MN-major (bf16 core matrices), the hi and lo parts of S [kTile, K] and of delta [kTile, C]
// MN-major, the tile on its way to global memory (delta [C, kTile] fp32 Swizzled, or with
// kOutput o [C, kTile] bf16 Swizzled16), with kOutput Q_up [C, K] and P [C, C] K-major, gamma_L
// [K]. 64.5 KB for 32 columns (three blocks per SM), 96.5 KB for 64 (two); with kOutput 84.5 and
// 112.5 KB (two). fp32 states go out through S's room once W S has read it.
template <int kTileV, bool kOutput>
struct FwdStateWgmmaLayout {
  static constexpr int kC = 64, kK = 128, kTile = kTileV;
  using Wm = CoreMatrices<kK>;     // W, Q_up [C, K]
  using KdT = CoreMatrices<kC>;    // K_down^T [K, C]
  using Pm = CoreMatrices<kC>;     // P [C, C]
  using S = CoreMatrices<kK>;      // S [kTile, K]
  using Delta = CoreMatrices<kC>;  // delta [kTile, C]
  static constexpr int w = 0, kd = w + Wm::bytes(kC), s_hi = kd + KdT::bytes(kK), s_lo = s_hi + S::bytes(kTile);
  static constexpr int d_hi = s_lo + S::bytes(kTile), d_lo = d_hi + Delta::bytes(kTile);
  static constexpr int out = d_lo + Delta::bytes(kTile);
  static constexpr int qu = out + (kOutput ? 2 : 4) * kC * kTile, pm = qu + (kOutput ? Wm::bytes(kC) : 0);
  static constexpr int g_last = pm + (kOutput ? Pm::bytes(kC) : 0), bytes = g_last + 4 * kK;
  static_assert(s_lo + S::bytes(kTile) - s_hi == 4 * kK * kTile, "S's room holds the fp32 state");
};

// Elements (d, e) and (d, e + 1) of the state entering a chunk, whose [K, V] block starts at `base`,
// into intermediate_states ([B, NT, HV, K, V] or [.., V, K], o's dtype). Out of line: a rarely
// asked output whose addressing would otherwise hold registers through the chunk loop.
__device__ __noinline__ void store_intermediate_pair(const ForwardParams& p, int64_t base, int d, int e, float2 x) {
  for (int i = 0; i < 2; ++i) {
    const int64_t at = p.state_v_first ? static_cast<int64_t>(e + i) * p.K + d : static_cast<int64_t>(d) * p.V + e + i;
    store_float(p.intermediate_states, p.o_dtype, base + at, i == 0 ? x.x : x.y);
  }
}

// How many blocks of the pass share an SM: as many as its shared memory holds (228 KB an SM, 1 KB
// of it reserved per block), at most three; the register cap follows.
template <int kTile, bool kOutput>
constexpr int fwd_state_wgmma_blocks_per_sm() {
  constexpr int fit = 228 * 1024 / (FwdStateWgmmaLayout<kTile, kOutput>::bytes + 1024);
  return fit < 3 ? fit : 3;
}

// kTile: 32 or 64 columns a block. Stored: the element type of the states and delta as they leave
// (p.ws.p_states_dtype): bf16 states are S's hi part as mirrored, fp32 ones are staged in S's
// room. Stored = void: F5 inside the pass (ws.output_in_state_pass): the states and delta stay on
// chip and o = s Q_up S + P delta leaves in bf16, Q_up S summed with W S, P delta with K_down^T
// delta, both products reading the S and delta operands already in shared memory.
template <int kTile, typename Stored>
__global__ void
__launch_bounds__(StateConfig::kThreads, fwd_state_wgmma_blocks_per_sm<kTile, std::is_void_v<Stored>>())
    fwd_state_wgmma_kernel(const __grid_constant__ ForwardParams p) {
  constexpr bool kOutput = std::is_void_v<Stored>;
  using L = FwdStateWgmmaLayout<kTile, kOutput>;
  using Rows = Swizzled<kTile / 4>;
  using Rows16 = Swizzled16<kTile / 8>;
  constexpr int kThreads = StateConfig::kThreads, C = L::kC, K = L::kK, V = CommonDims::v(ForwardParams{});
  constexpr bool kBf16States = sizeof(std::conditional_t<kOutput, float, Stored>) == 2;
  static_assert(CommonDims::chunk(ForwardParams{}) == C && CommonDims::k(ForwardParams{}) == K && V % kTile == 0,
                "the common shape, whole V-tiles");
  const WgmmaStateBlock<kTile> b(p);
  extern __shared__ __align__(128) float smem_floats[];
  char* smem = reinterpret_cast<char*>(smem_floats);
  char* W = smem + L::w;
  char* kd = smem + L::kd;
  const float* g_last = reinterpret_cast<const float*>(smem + L::g_last);
  const auto* w_src = static_cast<const __nv_bfloat16*>(p.ws.W) + b.first * K;
  const auto* kd_src = static_cast<const __nv_bfloat16*>(p.ws.k_down) + b.first * K;
  const auto* qu_src = static_cast<const __nv_bfloat16*>(p.ws.q_up) + b.first * p.ws.q_up_pitch;
  const auto* p_src = static_cast<const __nv_bfloat16*>(p.ws.P) + b.first * C;
  const float* u_src = p.ws.U + b.first * V + b.e0;
  // Group A: W (and Q_up) of chunk j; group B: K_down, gamma_L (and P). Rows past the end are zero.
  auto issue_values = [&](int64_t j) {
    copy_cells16_async<kThreads, C, K / 8>(W, w_src + j * b.step * K, 2 * p.HV * K, b.rows_of(j),
                                           [](int r, int c) { return L::Wm::k_major(r, 8 * c); });
    if constexpr (kOutput) {
      const int64_t pitch = p.ws.q_up_pitch;
      copy_cells16_async<kThreads, C, K / 8>(smem + L::qu, qu_src + j * b.step * pitch, 2 * p.HV * pitch, b.rows_of(j),
                                             [](int r, int c) { return L::Wm::k_major(r, 8 * c); });
    }
    cp_async_commit();
  };
  auto issue_update = [&](int64_t j) {
    copy_cells16_async<kThreads, C, K / 8>(kd, kd_src + j * b.step * K, 2 * p.HV * K, b.rows_of(j),
                                           [](int r, int c) { return L::KdT::mn_major(8 * c, r); });
    copy_cells16_async<kThreads, 1, K / 4>(smem + L::g_last, p.ws.g_last + (b.first_state + j * p.HV) * K, 0, 1,
                                           [](int, int c) { return 16 * c; });
    if constexpr (kOutput) {
      copy_cells16_async<kThreads, C, C / 8>(smem + L::pm, p_src + j * b.step * C, 2 * p.HV * C, b.rows_of(j),
                                             [](int r, int c) { return L::Pm::k_major(r, 8 * c); });
    }
    cp_async_commit();
  };
  // U of chunk j into registers, in the layout of the warpgroup's delta accumulator, loaded a chunk
  // ahead: no shared memory, no barrier.
  float u[kTile / 16][4];

  float s[kTile / 8][4];
  transform_acc(s, [&](int r, int col, float) {
    return p.initial_state != nullptr ? p.initial_state[state_index(p, b.n, b.head, b.row0 + r, b.e0 + col)] : 0.f;
  });
  if (b.chunks > 0) {
    issue_values(0);
    issue_update(0);
    b.load_chunk_rows(u, u_src, 0);
  }
  for (int64_t j = 0; j < b.chunks; ++j) {
    const int l = b.rows_of(j);
    char* const ops = unhoisted(smem);  // the products' operands
    // h_j: the split mirror (its readers waited at the previous chunk's barriers), and
    // intermediate_states ([B, NT, HV, ...], (b, j) flattening to the chunk row as the states').
    const int64_t base = (b.first_state + j * p.HV) * K * V;
    for_each_acc_pair(s, [&](int r, int col, float2 x) {
      const int d = b.row0 + r;
      store_split_pair(smem + L::s_hi, smem + L::s_lo, L::S::mn_major(col, d), x);
      if (p.intermediate_states != nullptr) store_intermediate_pair(p, base, d, b.e0 + col, x);
    });
    cp_async_wait<1>();  // group A of chunk j (group B may still be in flight)
    fence_proxy_async_shared();
    __syncthreads();
    // delta = U - W S, then o = Q_up S (S's hi part, the bf16 states that fwd_output reads), the
    // warpgroup's half of the columns (the B operand's column blocks from kTile / 16 half). delta
    // waits for its own group only.
    float acc[kTile / 16][4] = {}, o[kTile / 16][4] = {};
    pin_accumulator(acc);
    pin_accumulator(o);
    wgmma_fence();
    wgmma_split_b<K, 0>(acc, ops + L::w, 0, ops + L::s_hi, ops + L::s_lo, kTile / 16 * b.half);
    wgmma_commit();
    if constexpr (kOutput) {
      wgmma_over_k<K, 0>(o, ops + L::qu, 0, ops + L::s_hi, kTile / 16 * b.half);
      wgmma_commit();
    }
    if constexpr (!kOutput && kBf16States) {  // row d's 8-column blocks of S's hi part, while the product runs
      store_cells16<kThreads, K, kTile / 8>(static_cast<Stored*>(p.ws.states) + base + b.e0, 2 * V, smem + L::s_hi, K,
                                            [](int d, int c) { return L::S::mn_major(8 * c, d); });
    }
    wgmma_wait<kOutput ? 1 : 0>();
    pin_accumulator(acc);
#pragma unroll
    for (int t = 0; t < kTile / 16; ++t) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[t][i] = u[t][i] - acc[t][i];
    }
    for_each_acc_pair(acc, [&](int r, int col, float2 d) {
      const int row = b.crow0 + r, e = kTile / 2 * b.half + col;
      store_split_pair(smem + L::d_hi, smem + L::d_lo, L::Delta::mn_major(e, row), d);
      if constexpr (!kOutput) store2(reinterpret_cast<float*>(smem + L::out + Rows::at(row, e)), d);
    });
    if (j + 1 < b.chunks) b.load_chunk_rows(u, u_src, j + 1);
    if constexpr (kOutput) {
      wgmma_wait();
      pin_accumulator(o);
      transform_acc(o, [&](int, int, float x) { return p.scale * x; });
    }
    cp_async_wait<0>();  // group B of chunk j
    fence_proxy_async_shared();
    __syncthreads();  // W, Q_up and S are consumed; delta, K_down, gamma_L and P are in
    if (j + 1 < b.chunks) issue_values(j + 1);
    if constexpr (!kOutput) {
      float* delta = p.ws.delta + (b.first + j * b.step) * V + b.e0;
      store_cells16<kThreads, C, kTile / 4>(delta, 4 * p.HV * V, smem + L::out, l, Rows::cell);
      if constexpr (!kBf16States) {
        for_each_acc_pair(s, [&](int r, int col, float2 x) {
          store2(reinterpret_cast<float*>(smem + L::s_hi + Rows::at(b.row0 + r, col)), x);
        });
      }
    }
    const float decay[2] = {expf(g_last[b.row0 + acc_row(0)]), expf(g_last[b.row0 + acc_row(2)])};
    transform_acc(s, [&](int r, int, float x) { return decay[r == acc_row(0) ? 0 : 1] * x; });
    pin_accumulator(s);
    pin_accumulator(o);
    wgmma_fence();
    wgmma_split_b<C, 1>(s, ops + L::kd, 8 * b.half, ops + L::d_hi, ops + L::d_lo, 0);
    if constexpr (kOutput) wgmma_split_b<C, 0>(o, ops + L::pm, 0, ops + L::d_hi, ops + L::d_lo, kTile / 16 * b.half);
    wgmma_commit();
    if constexpr (!kOutput && !kBf16States) {  // h_j staged above, stored while the product runs
      __syncthreads();
      store_cells16<kThreads, K, kTile / 4>(static_cast<Stored*>(p.ws.states) + base + b.e0, 4 * V, smem + L::s_hi, K,
                                            Rows::cell);
    }
    wgmma_wait();
    pin_accumulator(s);
    pin_accumulator(o);
    if constexpr (kOutput) {  // o's rows staged (the tile's previous reads ended at two barriers since)
      for_each_acc_pair(o, [&](int r, int col, float2 x) {
        store2(reinterpret_cast<__nv_bfloat16*>(smem + L::out + Rows16::at(b.crow0 + r, kTile / 2 * b.half + col)), x);
      });
    }
    __syncthreads();  // K_down, gamma_L, delta, P and the staged rows are consumed; o's rows are in
    if (j + 1 < b.chunks) issue_update(j + 1);
    if constexpr (kOutput) {
      if (p.o != nullptr) {
        store_cells16<kThreads, C, kTile / 8>(static_cast<__nv_bfloat16*>(p.o) + (b.first + j * b.step) * V + b.e0,
                                              2 * p.HV * V, smem + L::out, l, Rows16::cell);
      }
    }
  }
  if (p.final_state == nullptr) return;
  for_each_acc(s, [&](int r, int col, float x) {
    p.final_state[state_index(p, b.n, b.head, b.row0 + r, b.e0 + col)] = x;
  });
}

}  // namespace fkt::cuda
