// B2 on CUDA for bf16 products and a bf16 dO at the common shape (C = 64, K = V = 128): the state
// gradient walked back through the chunks with the gradient held transposed in registers, so that
// its products take their fp32 operand from registers (wgmma's A, "RS", as fwd_state_wgmma) and read
// only the chunk's operands from shared memory, where TMA puts them. One warpgroup per (sequence,
// value head, 64-column V-tile), walking the chunks in reverse:
// - the gradient of the state leaving the chunk is held as E^T = dS^T / s [64 value columns, K]
//   (fp32, registers: warp w holds value columns 16w .. 16w + 15), the accumulator of the update
//   E^T <- E^T diag(exp(gamma_L)) - (d_delta / s)^T W + dO^T Q_up (B = W, Q_up: MN-major as their
//   rows are stored; dO^T is the A of the last product, read by it from dO's tile: "SS"). Scaled
//   so, s Q_up^T dO needs no accumulator of its own.
// - d_delta^T = dS^T K_down^T + dO^T P (B = K_down, K-major; P, MN-major; dO^T read by the second
//   product from dO's tile): the intra part of d_delta, P^T dO, formed here where B1 formed it
//   before, so that it never goes through global memory.
// - A = dS^T and d_delta^T / s in two bf16 parts each (hi + lo, a_fragment): the sum holds the fp32
//   operand to 2^-17.
// - dS and d_delta leave in whole rows of the tile, staged fp32 in shared memory: dS in fp16 with a
//   scale per row (common/scaled_half.cuh), d_delta rounded to TF32 (tf32_rounded: bwd_wy_inter's
//   TF32 wgmma products read it as it is); dh0 leaves unrounded.
// One thread issues the copies: the previous chunk's K_down and gamma_L once this chunk's d_delta
// has been formed, its W, Q_up, dO and P once this chunk's update has run, each group on its
// mbarrier.
#pragma once

#include <cuda.h>

#include "cuda/common/mma.cuh"
#include "cuda/common/scaled_half.cuh"
#include "cuda/common/tile_copy.cuh"
#include "cuda/common/tma.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/sm90/backward/params.hpp"
#include "cuda/sm90/dims.hpp"
#include "cuda/sm90/forward/chunks.cuh"
#include "cuda/sm90/forward/wgmma_state_block.cuh"

namespace fkt::cuda {

// The pass's arguments: the backward's, and tensor maps (row_tensor_map in sm90/tensor_map.hpp) of
// the rows it reads, boxes of 64 tokens.
struct BwdStateWgmmaParams {
  BackwardParams p;
  CUtensorMap k_down, w, q_up;  // [B*T, HV, K] bf16
  CUtensorMap d_o;              // [B*T, HV, V] bf16
  CUtensorMap P;                // [B*T, HV, C] bf16
};

// Shared memory, byte offsets from a 1024-byte aligned base: TMA boxes of 64 rows x 128 bytes,
// K_down, W and Q_up in two column halves, dO's 64 columns and P in one; the tiles on their way to
// global memory, fp32 (SwizzledByRow): d_delta [C, 64], whose room holds P's box until the products
// of d_delta have read it, and dS [K, 64]; gamma_L [K] as copied, exp(gamma_L) [K], two mbarriers.
// About 106 KB: two blocks per SM.
struct BwdStateWgmmaLayout {
  static constexpr int kC = 64, kK = 128, kTile = 64, kThreads = 128, kBox = 64 * 128;
  using Rows32 = SwizzledByRow<kTile / 4, float>;
  static constexpr int kd = 0, w = kd + 2 * kBox, qu = w + 2 * kBox, d_o = qu + 2 * kBox;
  static constexpr int dd = d_o + kBox, p = dd;  // w .. p: six adjacent boxes
  static constexpr int ds = dd + 4 * kC * kTile, g_last = ds + 4 * kK * kTile;
  static constexpr int decay = g_last + 4 * kK, bars = decay + 4 * kK, bytes = bars + 16;
  static constexpr int kAlign = 1024, launch_bytes = bytes + kAlign;  // room to align the base
  // The expected bytes of the two copy groups.
  static constexpr uint32_t kDeltaBytes = 2 * kBox + 4 * kK, kUpdateBytes = 6 * kBox;
  static_assert(kBox <= 4 * kC * kTile, "P's box fits d_delta's room");
};

// The block's work, for bwd_state_wgmma_kernel and for state_passes_kernel; params: a kernel
// parameter (its tensor maps are read by TMA where they are).
__device__ __forceinline__ void bwd_state_wgmma(const BwdStateWgmmaParams& params) {
  using L = BwdStateWgmmaLayout;
  constexpr int kThreads = L::kThreads, C = L::kC, K = L::kK, kTile = L::kTile, kBox = L::kBox;
  constexpr int V = CommonDims::v(ForwardParams{});
  static_assert(CommonDims::chunk(ForwardParams{}) == C && CommonDims::k(ForwardParams{}) == K, "the common shape");
  static_assert(kTile == kStateScaleCols, "a scale per row of the tile (store_scaled_half_rows)");
  const BackwardParams& p = params.p;
  const ForwardParams& f = p.fwd;
  const WgmmaStateBlock<kTile> b(f);
  const int v0 = 16 * static_cast<int>(threadIdx.x / 32);  // the warp's first value column in the tile
  const bool leader = threadIdx.x == 0;
  const float s = f.scale, inv_s = 1.f / f.scale;
  extern __shared__ __align__(1024) char smem_raw[];
  char* const smem = align_shared<L::kAlign>(smem_raw);
  uint64_t* const delta_ready = reinterpret_cast<uint64_t*>(smem + L::bars);
  uint64_t* const update_ready = delta_ready + 1;
  const float* const g_last = reinterpret_cast<const float*>(smem + L::g_last);
  float* const decay = reinterpret_cast<float*>(smem + L::decay);
  float* const d_delta = p.ws.d_delta + b.first * V + b.e0;
  // Chunk j's rows start at token row first_row + j C of the maps' [B*T, HV, .] tensors; rows past
  // its end belong to the next sequence (or read as zero past the tensor): d_delta's columns there
  // are zeroed below, and so are W's, Q_up's, dO's and P's rows, which the products would add.
  auto issue_delta = [&](int64_t j) {
    mbarrier_expect_bytes(delta_ready, L::kDeltaBytes);
    for (int h = 0; h < 2; ++h) {
      tma_load(smem + L::kd + h * kBox, params.k_down, delta_ready, 64 * h, b.head, b.token(j));
    }
    bulk_load(smem + L::g_last, f.ws.g_last + (b.first_state + j * f.HV) * K, 4 * K, delta_ready);
  };
  auto issue_update = [&](int64_t j) {
    mbarrier_expect_bytes(update_ready, L::kUpdateBytes);
    for (int h = 0; h < 2; ++h) {
      tma_load(smem + L::w + h * kBox, params.w, update_ready, 64 * h, b.head, b.token(j));
      tma_load(smem + L::qu + h * kBox, params.q_up, update_ready, 64 * h, b.head, b.token(j));
    }
    tma_load(smem + L::d_o, params.d_o, update_ready, b.e0, b.head, b.io_token(j));
    tma_load(smem + L::p, params.P, update_ready, 0, b.head, b.io_token(j));
  };

  // E^T = dS^T / s: value column v0 + r, state row 64h + col of e[h].
  float e[2][8][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    transform_acc(e[h], [&](int r, int col, float) {
      const float* dht = p.d_final_state;
      return dht != nullptr ? inv_s * dht[state_index(f, b.n, b.head, 64 * h + col, b.e0 + v0 + r)] : 0.f;
    });
  }
  if (leader) {
    mbarrier_init(delta_ready);
    mbarrier_init(update_ready);
  }
  __syncthreads();
  if (b.chunks > 0 && leader) {
    issue_delta(b.chunks - 1);
    issue_update(b.chunks - 1);
  }
  for (int64_t j = b.chunks - 1; j >= 0; --j) {
    const int l = b.rows_of(j);
    const uint32_t parity = static_cast<uint32_t>((b.chunks - 1 - j) & 1);
    char* const ops = unhoisted(smem);  // the products' operands
    // dS^T = s E^T: staged for its store, and split for K_down dS.
    SplitFragment a[K / 16];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float ds[8][4];
#pragma unroll
      for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) ds[n][i] = s * e[h][n][i];
      }
      for_each_acc(ds, [&](int r, int col, float x) {
        *reinterpret_cast<float*>(smem + L::ds + L::Rows32::at(64 * h + col, v0 + r)) = x;
      });
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) a[4 * h + ks] = a_fragment(ds, ks);
    }
    mbarrier_wait(delta_ready, parity);
    decay[threadIdx.x] = expf(g_last[threadIdx.x]);
    // d_delta^T = dS^T K_down^T + dO^T P, the second product once the update's copies are in.
    float dd[C / 8][4] = {};
    pin_accumulator(dd);
    wgmma_fence();
    const uint64_t kd = Swizzled128::k_major(ops + L::kd);
#pragma unroll
    for (int ks = 0; ks < K / 16; ++ks) {  // 32 bytes into the rows of column half ks / 4
      wgmma_bf16_rs<1, 0>(dd, a[ks].hi, Swizzled128::plus(kd, ks / 4 * kBox + ks % 4 * 32));
      wgmma_bf16_rs<1, 0>(dd, a[ks].lo, Swizzled128::plus(kd, ks / 4 * kBox + ks % 4 * 32));
    }
    wgmma_commit();
    wgmma_wait();  // the split parts of dS^T, 64 registers, are free again
    mbarrier_wait(update_ready, parity);
    if (l < C) {
      zero_box_rows<kThreads, C>(smem + L::w, 6, l);  // W, Q_up, dO and P: six adjacent boxes
      fence_proxy_async_shared();
      __syncthreads();
    }
    wgmma_fence();
    const uint64_t d_o = Swizzled128::mn_major(ops + L::d_o), P = Swizzled128::mn_major(ops + L::p);
#pragma unroll
    for (int ks = 0; ks < C / 16; ++ks) {  // rows 16 ks onwards
      wgmma_bf16<1, 1>(dd, Swizzled128::plus(d_o, 16 * ks * 128), Swizzled128::plus(P, 16 * ks * 128));
    }
    wgmma_commit();
    wgmma_wait();
    pin_accumulator(dd);
    __syncthreads();  // every warp's products have read P, whose room takes d_delta's rows
    if (l < C) transform_acc(dd, [&](int, int col, float x) { return col < l ? x : 0.f; });
    for_each_acc(dd, [&](int r, int col, float x) {
      *reinterpret_cast<float*>(smem + L::dd + L::Rows32::at(col, v0 + r)) = tf32_rounded(x);
    });
    SplitFragment da[C / 16];
#pragma unroll
    for (int ks = 0; ks < C / 16; ++ks) {
      float scaled[2][4];
#pragma unroll
      for (int t = 0; t < 2; ++t) {
#pragma unroll
        for (int i = 0; i < 4; ++i) scaled[t][i] = inv_s * dd[2 * ks + t][i];
      }
      da[ks] = a_fragment(scaled, 0);
    }
    __syncthreads();  // K_down and gamma_L are consumed; exp(gamma_L), dS and d_delta are in
    if (leader && j > 0) issue_delta(j - 1);
    // E^T <- E^T diag(exp(gamma_L)) - (d_delta / s)^T W + dO^T Q_up.
#pragma unroll
    for (int h = 0; h < 2; ++h) transform_acc(e[h], [&](int, int col, float x) { return decay[64 * h + col] * x; });
    pin_accumulator(e[0]);
    pin_accumulator(e[1]);
    wgmma_fence();
    const uint64_t w = Swizzled128::mn_major(ops + L::w), qu = Swizzled128::mn_major(ops + L::qu);
#pragma unroll
    for (int ks = 0; ks < C / 16; ++ks) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // rows 16 ks onwards of column half h
        const int at = h * kBox + 16 * ks * 128;
        wgmma_bf16_rs<-1, 1>(e[h], da[ks].hi, Swizzled128::plus(w, at));
        wgmma_bf16_rs<-1, 1>(e[h], da[ks].lo, Swizzled128::plus(w, at));
        wgmma_bf16<1, 1>(e[h], Swizzled128::plus(d_o, 16 * ks * 128), Swizzled128::plus(qu, at));
      }
    }
    wgmma_commit();
    // While the products run: dS and d_delta in whole rows.
    const int64_t state = b.first_state + j * f.HV;
    store_scaled_half_rows<kThreads, K>(static_cast<__half*>(p.ws.d_states) + state * K * V + b.e0, V,
                                        p.ws.d_state_scales + state_scales_at(state, b.e0, V, K), smem + L::ds,
                                        L::Rows32::cell);
    store_cells16<kThreads, C, kTile / 4>(d_delta + j * b.step * V, 4 * f.HV * V, smem + L::dd, l, L::Rows32::cell);
    wgmma_wait();
    pin_accumulator(e[0]);
    pin_accumulator(e[1]);
    __syncthreads();  // W, Q_up and dO are consumed, and the staged rows stored
    if (leader && j > 0) {
      fence_proxy_async_shared();  // d_delta's staged rows, read and written here, before P's copy over them
      issue_update(j - 1);
    }
  }
  if (p.dh0 == nullptr) return;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    for_each_acc(e[h], [&](int r, int col, float x) {
      p.dh0[state_index(f, b.n, b.head, 64 * h + col, b.e0 + v0 + r)] = s * x;
    });
  }
}

__global__ void __launch_bounds__(BwdStateWgmmaLayout::kThreads, 2)
    bwd_state_wgmma_kernel(const __grid_constant__ BwdStateWgmmaParams params) {
  bwd_state_wgmma(params);
}

}  // namespace fkt::cuda
