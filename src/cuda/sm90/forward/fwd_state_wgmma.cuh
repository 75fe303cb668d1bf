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
// The next chunk's W, U are copied in while the state is updated, and its K_down while delta is
// computed (cp.async), as in fwd_state.
#pragma once

#include "cuda/common/convert.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/tile_copy.cuh"
#include "cuda/common/vec4.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/sm90/dims.hpp"
#include "cuda/sm90/forward/chunks.cuh"
#include "cuda/sm90/forward/state_config.hpp"

namespace fkt::cuda {

// Shared memory of a kTile-column V-tile, byte offsets: W [C, K] K-major and K_down^T [K, C]
// MN-major (bf16 core matrices), the hi and lo parts of S [kTile, K] and of delta [kTile, C]
// MN-major, U and delta (on its way to global memory) [C, kTile] fp32 Swizzled, gamma_L [K]: 72.5 KB
// for 32 columns (three blocks per SM), 112.5 KB for 64 (two). fp32 states go out through S's room
// once W S has read it.
template <int kTileV>
struct FwdStateWgmmaLayout {
  static constexpr int kC = 64, kK = 128, kTile = kTileV;
  using Wm = CoreMatrices<kK>;     // W [C, K]
  using KdT = CoreMatrices<kC>;    // K_down^T [K, C]
  using S = CoreMatrices<kK>;      // S [kTile, K]
  using Delta = CoreMatrices<kC>;  // delta [kTile, C]
  static constexpr int w = 0, kd = w + Wm::bytes(kC), s_hi = kd + KdT::bytes(kK), s_lo = s_hi + S::bytes(kTile);
  static constexpr int d_hi = s_lo + S::bytes(kTile), d_lo = d_hi + Delta::bytes(kTile);
  static constexpr int u = d_lo + Delta::bytes(kTile), out = u + 4 * kC * kTile;
  static constexpr int g_last = out + 4 * kC * kTile, bytes = g_last + 4 * kK;
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

// How many blocks of a kTile-column pass share an SM, by shared memory (the register cap follows).
template <int kTile>
constexpr int fwd_state_wgmma_blocks_per_sm() {
  return kTile == 32 ? 3 : 2;
}

// kTile: 32 or 64 columns a block. Stored: the element type of the states (p.ws.p_states_dtype):
// bf16 states are S's hi part as mirrored; fp32 ones are staged in S's room.
template <int kTile, typename Stored>
__global__ void __launch_bounds__(StateConfig::kThreads, fwd_state_wgmma_blocks_per_sm<kTile>())
    fwd_state_wgmma_kernel(const __grid_constant__ ForwardParams p) {
  using L = FwdStateWgmmaLayout<kTile>;
  using Rows = Swizzled<kTile / 4>;
  constexpr int kThreads = StateConfig::kThreads, C = L::kC, K = L::kK, V = CommonDims::v(ForwardParams{});
  constexpr bool kBf16States = sizeof(Stored) == 2;
  static_assert(CommonDims::chunk(ForwardParams{}) == C && CommonDims::k(ForwardParams{}) == K && V % kTile == 0,
                "the common shape, whole V-tiles");
  constexpr int tiles = V / kTile;
  const int64_t n = blockIdx.x / tiles;
  const int head = blockIdx.y, e0 = static_cast<int>(blockIdx.x % tiles) * kTile;
  const SequenceSpan seq = sequence_span(p, n);
  extern __shared__ __align__(128) float smem_floats[];
  char* smem = reinterpret_cast<char*>(smem_floats);
  char* W = smem + L::w;
  char* kd = smem + L::kd;
  const float* U = reinterpret_cast<const float*>(smem + L::u);
  const float* g_last = reinterpret_cast<const float*>(smem + L::g_last);
  const int warp = threadIdx.x / 32, half = warp / 4;
  const int row0 = 64 * half + 16 * (warp % 4);  // the warp's first state row
  const int crow0 = 16 * (warp % 4);             // its first chunk row of delta
  const int64_t chunks = ceil_div(seq.length, C);
  // (token, head) rows: the sequence's first, and a chunk's advance; chunk rows of a state.
  const int64_t first = seq.first_row * p.HV + head, step = static_cast<int64_t>(C) * p.HV;
  const int64_t first_state = seq.first_chunk * p.HV + head;
  const auto* w_src = static_cast<const __nv_bfloat16*>(p.ws.W) + first * K;
  const auto* kd_src = static_cast<const __nv_bfloat16*>(p.ws.k_down) + first * K;
  const float* u_src = p.ws.U + first * V + e0;
  float* delta_dst = p.ws.delta + first * V + e0;
  auto rows_of = [&](int64_t j) { return static_cast<int>(min(static_cast<int64_t>(C), seq.length - j * C)); };
  // Group A: W and U of chunk j; group B: K_down and gamma_L. Rows past the end are zero.
  auto issue_values = [&](int64_t j) {
    const int64_t row = j * step;
    copy_cells16_async<kThreads, C, K / 8>(W, w_src + row * K, 2 * p.HV * K, rows_of(j),
                                           [](int r, int c) { return L::Wm::k_major(r, 8 * c); });
    copy_cells16_async<kThreads, C, kTile / 4>(smem + L::u, u_src + row * V, 4 * p.HV * V, rows_of(j), Rows::cell);
    cp_async_commit();
  };
  auto issue_update = [&](int64_t j) {
    copy_cells16_async<kThreads, C, K / 8>(kd, kd_src + j * step * K, 2 * p.HV * K, rows_of(j),
                                           [](int r, int c) { return L::KdT::mn_major(8 * c, r); });
    copy_cells16_async<kThreads, 1, K / 4>(smem + L::g_last, p.ws.g_last + (first_state + j * p.HV) * K, 0, 1,
                                           [](int, int c) { return 16 * c; });
    cp_async_commit();
  };

  float s[kTile / 8][4];
  transform_acc(s, [&](int r, int col, float) {
    return p.initial_state != nullptr ? p.initial_state[state_index(p, n, head, row0 + r, e0 + col)] : 0.f;
  });
  if (chunks > 0) {
    issue_values(0);
    issue_update(0);
  }
  for (int64_t j = 0; j < chunks; ++j) {
    const int l = rows_of(j);
    // h_j: the split mirror (its readers waited at the previous chunk's barriers), and
    // intermediate_states ([B, NT, HV, ...], (b, j) flattening to the chunk row as the states').
    const int64_t base = (first_state + j * p.HV) * K * V;
    Stored* h = static_cast<Stored*>(p.ws.states) + base + e0;
    for_each_acc_pair(s, [&](int r, int col, float2 x) {
      const int d = row0 + r;
      store_split_pair(smem + L::s_hi, smem + L::s_lo, L::S::mn_major(col, d), x);
      if (p.intermediate_states != nullptr) store_intermediate_pair(p, base, d, e0 + col, x);
    });
    cp_async_wait<1>();  // group A of chunk j (group B may still be in flight)
    fence_proxy_async_shared();
    __syncthreads();
    // delta = U - W S, the warpgroup's half of the columns (the B operand's column blocks from
    // kTile / 16 half).
    float acc[kTile / 16][4] = {};
    pin_accumulator(acc);
    wgmma_fence();
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += 16) {
      const uint64_t a = L::Wm::descriptor(W, 0, k0);
      wgmma_bf16<0, 1>(acc, a, L::S::descriptor(smem + L::s_hi, kTile / 16 * half, k0));
      wgmma_bf16<0, 1>(acc, a, L::S::descriptor(smem + L::s_lo, kTile / 16 * half, k0));
    }
    wgmma_commit();
    if constexpr (kBf16States) {  // row d's 8-column blocks of S's hi part, while the product runs
      store_cells16<kThreads, K, kTile / 8>(h, 2 * V, smem + L::s_hi, K,
                                            [](int d, int c) { return L::S::mn_major(8 * c, d); });
    }
    wgmma_wait_all();
    pin_accumulator(acc);
    for_each_acc_pair(acc, [&](int r, int col, float2 x) {
      const int row = crow0 + r, e = kTile / 2 * half + col;
      const float2 u = load2(U + Rows::at(row, e) / 4);
      const float2 d = row < l ? make_float2(u.x - x.x, u.y - x.y) : make_float2(0.f, 0.f);
      store_split_pair(smem + L::d_hi, smem + L::d_lo, L::Delta::mn_major(e, row), d);
      store2(reinterpret_cast<float*>(smem + L::out + Rows::at(row, e)), d);
    });
    cp_async_wait<0>();  // group B of chunk j
    fence_proxy_async_shared();
    __syncthreads();  // W, U and S are consumed; delta, K_down and gamma_L are in
    if (j + 1 < chunks) issue_values(j + 1);
    store_cells16<kThreads, C, kTile / 4>(delta_dst + j * step * V, 4 * p.HV * V, smem + L::out, l, Rows::cell);
    if constexpr (!kBf16States) {
      for_each_acc_pair(s, [&](int r, int col, float2 x) {
        store2(reinterpret_cast<float*>(smem + L::s_hi + Rows::at(row0 + r, col)), x);
      });
    }
    const float decay[2] = {expf(g_last[row0 + acc_row(0)]), expf(g_last[row0 + acc_row(2)])};
    transform_acc(s, [&](int r, int, float x) { return decay[r == acc_row(0) ? 0 : 1] * x; });
    pin_accumulator(s);
    wgmma_fence();
#pragma unroll
    for (int k0 = 0; k0 < C; k0 += 16) {
      const uint64_t a = L::KdT::descriptor(kd, 8 * half, k0);
      wgmma_bf16<1, 1>(s, a, L::Delta::descriptor(smem + L::d_hi, 0, k0));
      wgmma_bf16<1, 1>(s, a, L::Delta::descriptor(smem + L::d_lo, 0, k0));
    }
    wgmma_commit();
    if constexpr (!kBf16States) {  // h_j staged above, stored while the product runs
      __syncthreads();
      store_cells16<kThreads, K, kTile / 4>(h, 4 * V, smem + L::s_hi, K, Rows::cell);
    }
    wgmma_wait_all();
    pin_accumulator(s);
    __syncthreads();  // K_down, gamma_L, delta and the staged rows are consumed
    if (j + 1 < chunks) issue_update(j + 1);
  }
  if (p.final_state == nullptr) return;
  for_each_acc(s, [&](int r, int col, float x) {
    p.final_state[state_index(p, n, head, row0 + r, e0 + col)] = x;
  });
}

}  // namespace fkt::cuda
