// B2 on CUDA for bf16 products and a bf16 dO at the common shape (C = 64, K = V = 128):
// bwd_state's pass with its products on wgmma (common/wgmma.cuh), one block of two warpgroups per
// (sequence, value head, kTile-column V-tile, with_wgmma_state_tile), walking the chunks in
// reverse:
// - dS, the gradient of the state leaving the chunk, is held as E = dS / s (fp32, registers), the
//   accumulator of the update E <- exp(gamma_L) E - W^T (d_delta / s) + Q_up^T dO: warpgroup h
//   holds state rows 64h .. 64h + 63 at all kTile columns (A = W^T, Q_up^T: MN-major as W's and
//   Q_up's rows are stored). Scaled so, s Q_up^T dO needs no accumulator of its own.
// - d_delta = intra part (B1) + K_down dS: warpgroup h computes columns kTile / 2 h onwards
//   (A = K_down, K-major); the intra part comes to registers a chunk ahead.
// - The B operands dS and d_delta / s go to shared memory MN-major, split in bf16 hi and lo parts
//   as in fwd_state_wgmma; dO is copied in as given. dS and d_delta leave in whole rows of 16-byte
//   stores, staged fp32 in the rooms of dS's parts and of K_down once K_down dS has read them (the
//   phase that stored d_delta as the accumulator's 8-byte pieces, with its split parts, took 26%
//   of a step at B1_T8192_H96).
// The previous chunk's operands are copied in (cp.async) at the end of a step: K_down while the
// next mirror of dS is stored, W, Q_up, gamma_L and dO while d_delta is computed.
#pragma once

#include "cuda/common/convert.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/tile_copy.cuh"
#include "cuda/common/vec4.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/sm90/backward/params.hpp"
#include "cuda/sm90/dims.hpp"
#include "cuda/sm90/forward/chunks.cuh"
#include "cuda/sm90/forward/state_config.hpp"
#include "cuda/sm90/forward/wgmma_state_block.cuh"

namespace fkt::cuda {

// Shared memory of a kTile-column V-tile, byte offsets: K_down [C, K] K-major, whose room then holds
// d_delta [C, kTile] fp32 (Swizzled), W^T and Q_up^T [K, C] MN-major (bf16 core matrices); dS's hi
// and lo parts [kTile, K] MN-major, whose room then holds dS [K, kTile] fp32 (Swizzled); d_delta /
// s's hi and lo parts and dO [kTile, C] MN-major; gamma_L [K]: 76.5 KB for 32 columns, 104.5 KB
// for 64 (two blocks per SM either way).
template <int kTileV>
struct BwdStateWgmmaLayout {
  static constexpr int kC = 64, kK = 128, kTile = kTileV;
  using Kd = CoreMatrices<kK>;     // K_down [C, K]
  using RowsT = CoreMatrices<kC>;  // W^T, Q_up^T [K, C]
  using DS = CoreMatrices<kK>;     // dS [kTile, K]
  using Delta = CoreMatrices<kC>;  // d_delta / s, dO [kTile, C]
  static constexpr int kd = 0, w = kd + Kd::bytes(kC), qu = w + RowsT::bytes(kK), ds_hi = qu + RowsT::bytes(kK);
  static constexpr int ds_lo = ds_hi + DS::bytes(kTile), dd_hi = ds_lo + DS::bytes(kTile);
  static constexpr int dd_lo = dd_hi + Delta::bytes(kTile), d_o = dd_lo + Delta::bytes(kTile);
  static constexpr int g_last = d_o + Delta::bytes(kTile), bytes = g_last + 4 * kK;
  static_assert(2 * DS::bytes(kTile) == 4 * kK * kTile, "dS's room holds the fp32 dS");
};

template <int kTile>
__global__ void __launch_bounds__(StateConfig::kThreads, 2)
    bwd_state_wgmma_kernel(const __grid_constant__ BackwardParams p) {
  using L = BwdStateWgmmaLayout<kTile>;
  // Rows of kTile fp32 on their way to global memory: dS [K, kTile] staged in its operand's room,
  // d_delta [C, kTile] in K_down's.
  using Rows = Swizzled<kTile / 4>;
  static_assert(4 * L::kC * kTile <= L::w - L::kd, "K_down's room holds the fp32 d_delta");
  const ForwardParams& f = p.fwd;
  constexpr int kThreads = StateConfig::kThreads, C = L::kC, K = L::kK, V = CommonDims::v(ForwardParams{});
  static_assert(CommonDims::chunk(ForwardParams{}) == C && CommonDims::k(ForwardParams{}) == K && V % kTile == 0,
                "the common shape, whole V-tiles");
  const WgmmaStateBlock<kTile> b(f);
  extern __shared__ __align__(128) float smem_floats[];
  char* smem = reinterpret_cast<char*>(smem_floats);
  const float* g_last = reinterpret_cast<const float*>(smem + L::g_last);
  const float s = f.scale, inv_s = 1.f / f.scale;
  const auto* kd_src = static_cast<const __nv_bfloat16*>(f.ws.k_down) + b.first * K;
  const auto* w_src = static_cast<const __nv_bfloat16*>(f.ws.W) + b.first * K;
  const auto* qu_src = static_cast<const __nv_bfloat16*>(f.ws.q_up) + b.first * f.ws.q_up_pitch;
  const auto* d_o_src = static_cast<const __nv_bfloat16*>(p.d_o) + b.first * V + b.e0;
  float* d_delta = p.ws.d_delta + b.first * V + b.e0;
  auto mn_rows = [](int r, int c) { return L::RowsT::mn_major(8 * c, r); };
  // Group A: K_down of chunk j; group B: W, Q_up, gamma_L and dO. Rows past the end are zero.
  auto issue_delta = [&](int64_t j) {
    copy_cells16_async<kThreads, C, K / 8>(smem + L::kd, kd_src + j * b.step * K, 2 * f.HV * K, b.rows_of(j),
                                           [](int r, int c) { return L::Kd::k_major(r, 8 * c); });
    cp_async_commit();
  };
  auto issue_update = [&](int64_t j) {
    const int64_t row = j * b.step, pitch = f.ws.q_up_pitch;
    copy_cells16_async<kThreads, C, K / 8>(smem + L::w, w_src + row * K, 2 * f.HV * K, b.rows_of(j), mn_rows);
    copy_cells16_async<kThreads, C, K / 8>(smem + L::qu, qu_src + row * pitch, 2 * f.HV * pitch, b.rows_of(j), mn_rows);
    copy_cells16_async<kThreads, 1, K / 4>(smem + L::g_last, f.ws.g_last + (b.first_state + j * f.HV) * K, 0, 1,
                                           [](int, int c) { return 16 * c; });
    copy_cells16_async<kThreads, C, kTile / 8>(smem + L::d_o, d_o_src + row * V, 2 * f.HV * V, b.rows_of(j),
                                               [](int r, int c) { return L::Delta::mn_major(8 * c, r); });
    cp_async_commit();
  };
  // The intra part of d_delta into registers, in the layout of the warpgroup's d_delta accumulator,
  // loaded a chunk ahead.
  float intra[kTile / 16][4];
  float e[kTile / 8][4];  // dS / s
  transform_acc(e, [&](int r, int col, float) {
    const float* dht = p.d_final_state;
    return dht != nullptr ? inv_s * dht[state_index(f, b.n, b.head, b.row0 + r, b.e0 + col)] : 0.f;
  });
  if (b.chunks > 0) {
    issue_delta(b.chunks - 1);
    issue_update(b.chunks - 1);
    b.load_chunk_rows(intra, d_delta, b.chunks - 1);
  }
  for (int64_t j = b.chunks - 1; j >= 0; --j) {
    const int l = b.rows_of(j);
    char* const ops = unhoisted(smem);  // the products' operands
    // The split mirror of dS (its readers waited at the later chunk's barriers).
    for_each_acc_pair(e, [&](int r, int col, float2 x) {
      store_split_pair(smem + L::ds_hi, smem + L::ds_lo, L::DS::mn_major(col, b.row0 + r),
                       make_float2(s * x.x, s * x.y));
    });
    float dd[kTile / 16][4];
#pragma unroll
    for (int t = 0; t < kTile / 16; ++t) {
#pragma unroll
      for (int i = 0; i < 4; ++i) dd[t][i] = intra[t][i];
    }
    cp_async_wait<1>();  // group A of chunk j (group B may still be in flight)
    fence_proxy_async_shared();
    __syncthreads();
    pin_accumulator(dd);
    wgmma_fence();
    wgmma_split_b<K, 0>(dd, ops + L::kd, 0, ops + L::ds_hi, ops + L::ds_lo, kTile / 16 * b.half);
    wgmma_commit();
    if (j > 0) b.load_chunk_rows(intra, d_delta, j - 1);
    wgmma_wait();
    pin_accumulator(dd);
    for_each_acc_pair(dd, [&](int r, int col, float2 x) {
      const int row = b.crow0 + r, c = kTile / 2 * b.half + col;
      store_split_pair(smem + L::dd_hi, smem + L::dd_lo, L::Delta::mn_major(c, row),
                       make_float2(inv_s * x.x, inv_s * x.y));
    });
    cp_async_wait<0>();  // group B of chunk j
    fence_proxy_async_shared();
    __syncthreads();  // K_down and dS's parts are consumed; d_delta's parts, W, Q_up, gamma_L and dO are in
    for_each_acc_pair(dd, [&](int r, int col, float2 x) {  // d_delta, staged in K_down's room for its store
      store2(reinterpret_cast<float*>(smem + L::kd + Rows::at(b.crow0 + r, kTile / 2 * b.half + col)), x);
    });
    for_each_acc_pair(e, [&](int r, int col, float2 x) {  // dS, staged for its store
      store2(reinterpret_cast<float*>(smem + L::ds_hi + Rows::at(b.row0 + r, col)), make_float2(s * x.x, s * x.y));
    });
    const float decay[2] = {expf(g_last[b.row0 + acc_row(0)]), expf(g_last[b.row0 + acc_row(2)])};
    transform_acc(e, [&](int r, int, float x) { return decay[r == acc_row(0) ? 0 : 1] * x; });
    pin_accumulator(e);
    wgmma_fence();
    wgmma_split_b<C, 1, -1>(e, ops + L::w, 8 * b.half, ops + L::dd_hi, ops + L::dd_lo, 0);
    wgmma_over_k<C, 1>(e, ops + L::qu, 8 * b.half, ops + L::d_o, 0);
    wgmma_commit();
    __syncthreads();  // dS and d_delta are staged
    // While the products run: dS and d_delta in whole rows.
    store_cells16<kThreads, K, kTile / 4>(p.ws.d_states + (b.first_state + j * f.HV) * K * V + b.e0, 4 * V,
                                          smem + L::ds_hi, K, Rows::cell);
    store_cells16<kThreads, C, kTile / 4>(d_delta + j * b.step * V, 4 * f.HV * V, smem + L::kd, l, Rows::cell);
    wgmma_wait();
    pin_accumulator(e);
    __syncthreads();  // W, Q_up, gamma_L, d_delta's parts, dO and the staged rows are consumed
    if (j > 0) {
      issue_delta(j - 1);
      issue_update(j - 1);
    }
  }
  if (p.dh0 == nullptr) return;
  for_each_acc(e, [&](int r, int col, float x) { p.dh0[state_index(f, b.n, b.head, b.row0 + r, b.e0 + col)] = s * x; });
}

}  // namespace fkt::cuda
