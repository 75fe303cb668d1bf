// B3's products with the states on wgmma, for bf16 products and a bf16 dO at the common shape
// (C = 64, K = V = 128): B0 = dO S^T, B1 = delta dS^T, B2 = d_delta S^T ([C, K] each, summed over
// the value columns), carry = rowsum(S * dS), and B1's dP = s tril(dO delta^T) (B2 forms B1's other
// product, so B1 is not launched). From tiles that TMA brings in, all of them issued at the block's
// start (one latency a block: the kernel runs one block per SM, so nothing else hides it).
// - TF32 products (wgmma .tf32, both operands K-major): the state passes store delta and d_delta
//   rounded to TF32 (tf32_rounded) and S and dS in fp16 with a power-of-two scale per row
//   (common/scaled_half.cuh), which the block widens into fp32 tiles, so the tensor cores'
//   truncation takes every operand exactly, as mma.sync took its rounded ones; dO (bf16) is exact
//   in TF32. S and dS of two tiles land in fp16 in the second tile's room, and each tile is widened
//   by the whole block before its products.
// - Warpgroup 0 forms dO S^T with dO's fragments read from its tile into registers (A, "RS"), 1
//   and 2 delta dS^T and d_delta S^T (SS), 3 the carry, a thread per state row, and dO delta^T
//   (RS, m64n64: in the first half of its accumulator, which it needs for nothing else).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include "cuda/common/mma.cuh"
#include "cuda/common/scaled_half.cuh"
#include "cuda/common/tma.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/sm90/backward/params.hpp"
#include "cuda/sm90/dims.hpp"
#include "cuda/sm90/forward/chunks.cuh"

namespace fkt::cuda {

// B3's arguments: the backward's, and with the state products on wgmma the tensor maps of their
// operands (sm90/tensor_map.hpp), else unused.
struct WyInterParams {
  BackwardParams p;
  CUtensorMap states, d_states;  // [chunks, HV * K, V] fp16, boxes of one head's K rows
  CUtensorMap delta, d_delta;    // [B*T, HV, V] fp32, boxes of C tokens
  CUtensorMap d_o;               // [B*T, HV, V] bf16, boxes of C tokens
};

// Shared memory, byte offsets from a 1024-byte aligned base: TMA boxes of 128-byte rows; per tile
// of 32 value columns S and dS [K, 32], delta and d_delta [C, 32] (fp32); for each pair of tiles,
// S and dS [K, 64] in fp16 (in the second tile's S and dS room) and dO [C, 64] (bf16); the scales
// of S's rows, then of dS's ([V / kStateScaleCols, K] fp32 each). 210 KB.
struct WyInterStateTiles {
  static constexpr int kC = 64, kK = 128, kV = 128, kCols = 32, kTiles = kV / kCols, kThreads = 512;
  static constexpr int s = 0, ds = s + kK * 128, delta = ds + kK * 128, d_delta = delta + kC * 128;
  static constexpr int kTileBytes = d_delta + kC * 128, d_o = kTiles * kTileBytes, kDoBox = kC * 128;
  static constexpr int scales = d_o + kTiles / 2 * kDoBox, kScaleBytes = kV / kStateScaleCols * kK * 4;
  static constexpr int bytes = scales + 2 * kScaleBytes;
  // The expected bytes of a tile's barrier: delta and d_delta; for the first of a pair S, dS and
  // dO; for the first tile the scales.
  static constexpr uint32_t kDeltaBytes = 2 * kC * 128, kPairBytes = 2 * kK * 128 + kDoBox;
};

// Writes B0, B1, B2 (rows ldb floats apart; the tiles' room, which they may overlap, is read before),
// carry [K] and the chunk's rows of dP. smem: the tiles' room (1024-byte aligned); ready: kTiles
// mbarriers.
__device__ __forceinline__ void wy_inter_state_products(const WyInterParams& params, const ChunkSpan& c, int64_t chunk,
                                                        int head, char* smem, uint64_t* ready, float* B0, float* B1,
                                                        float* B2, int ldb, float* carry) {
  using L = WyInterStateTiles;
  constexpr int C = L::kC, K = L::kK, V = L::kV;
  static_assert(CommonDims::chunk(ForwardParams{}) == C && CommonDims::k(ForwardParams{}) == K &&
                    CommonDims::v(ForwardParams{}) == V,
                "the common shape");
  const int tid = static_cast<int>(threadIdx.x), group = tid / 128, l = static_cast<int>(c.rows);
  const int row0 = 16 * (tid / 32 % 4), g = tid % 32 / 4, t = tid % 4;  // the warp's rows of B, its lane
  if (tid == 0) {
    for (int i = 0; i < L::kTiles; ++i) mbarrier_init(ready + i);
  }
  __syncthreads();
  if (tid == 0) {  // tile i's delta and d_delta on barrier i, S, dS and dO of tiles 2h and 2h + 1 on barrier 2h
    const int token = static_cast<int>(c.first_row), state_row = head * K, block = static_cast<int>(chunk);
    const int io_token = static_cast<int>(c.io_row);  // in dO's map
    for (int i = 0; i < L::kTiles; ++i) {
      char* const tile = smem + i * L::kTileBytes;
      const int col = i * L::kCols;
      mbarrier_expect_bytes(ready + i, L::kDeltaBytes + (i % 2 == 0 ? L::kPairBytes : 0) +
                                           (i == 0 ? 2 * L::kScaleBytes : 0));
      if (i == 0) {
        const int64_t first = state_scales_at(chunk * params.p.fwd.HV + head, 0, V, K);
        bulk_load(smem + L::scales, params.p.fwd.ws.state_scales + first, L::kScaleBytes, ready);
        bulk_load(smem + L::scales + L::kScaleBytes, params.p.ws.d_state_scales + first, L::kScaleBytes, ready);
      }
      if (i % 2 == 0) {
        char* const halves = tile + L::kTileBytes;
        tma_load(halves + L::s, params.states, ready + i, col, state_row, block);
        tma_load(halves + L::ds, params.d_states, ready + i, col, state_row, block);
        tma_load(smem + L::d_o + i / 2 * L::kDoBox, params.d_o, ready + i, col, head, io_token);
      }
      tma_load(tile + L::delta, params.delta, ready + i, col, head, token);
      tma_load(tile + L::d_delta, params.d_delta, ready + i, col, head, token);
    }
  }
  // Widening: a thread takes 8 columns (a 16-byte cell of 8 halves) of state row wr in each tile, of
  // S and of dS. A warp takes rows 8w .. 8w + 7, lanes 4k .. 4k + 3 one row, so that the eight lanes
  // of each 16-byte access phase read rows wr and wr + 4 (cells ^ (wr % 8) of different halves of the
  // row's banks) and write the two fp32 cells of each in opposite orders (cells of different parity).
  const int lane = tid % 32, side = lane / 4 % 2, q = lane % 4;
  const int wr = 8 * (tid / 32) + lane / 8 + 4 * side;
  const float* const scales = reinterpret_cast<const float*>(smem + L::scales);
  // Tile i's S and dS from their halves into its fp32 room (wgmma reads it after the caller's fence
  // and barrier); the second tile of a pair overwrites the halves, so every thread reads first.
  auto widen = [&](int i, char* tile) {
    const char* const halves = smem + (i | 1) * L::kTileBytes;
    const int in = wr * 128 + (((4 * (i % 2) + q) ^ (wr % 8)) * 16);
    const uint4 s16 = *reinterpret_cast<const uint4*>(halves + L::s + in);
    const uint4 ds16 = *reinterpret_cast<const uint4*>(halves + L::ds + in);
    if (i % 2 == 1) __syncthreads();
    auto put = [&](int region, uint4 cell, float scale) {  // fp32 cells 2q and 2q + 1, 2q + side first
      float4 lo, hi;
      widen_cell(cell, scale, lo, hi);
      char* const row = tile + region + wr * 128;
      *reinterpret_cast<float4*>(row + (((2 * q + side) ^ (wr % 8)) * 16)) = side ? hi : lo;
      *reinterpret_cast<float4*>(row + (((2 * q + 1 - side) ^ (wr % 8)) * 16)) = side ? lo : hi;
    };
    static_assert(2 * L::kCols == kStateScaleCols, "a scale for each pair of tiles");
    put(L::s, s16, scales[i / 2 * K + wr]);
    put(L::ds, ds16, scales[(V / kStateScaleCols + i / 2) * K + wr]);
  };
  // acc += the tile's four k-steps (k-step ks: 32 bytes into the operands' rows), issued,
  // committed and waited for inside one warpgroup's branch (a wgmma sequence split across
  // divergent paths is serialized by the compiler).
  auto products = [](auto& acc, auto k_step) {
    pin_accumulator(acc);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < L::kCols / 8; ++ks) k_step(ks);
    wgmma_commit();
    wgmma_wait();
    pin_accumulator(acc);
  };
  float acc[K / 8][4] = {};
  float(&d_p)[C / 8][4] = *reinterpret_cast<float(*)[C / 8][4]>(&acc);  // warpgroup 3's dO delta^T
  float row_sum = 0.f;
  for (int i = 0; i < L::kTiles; ++i) {
    char* const tile = smem + i * L::kTileBytes;
    mbarrier_wait(ready + i, 0);
    widen(i, tile);
    if (l < C) {  // the rows past the chunk's end, from the next sequence
      zero_box_rows<L::kThreads, C>(tile + L::delta, 2, l);  // delta and d_delta, adjacent
      if (i % 2 == 0) zero_box_rows<L::kThreads, C>(smem + L::d_o + i / 2 * L::kDoBox, 1, l);
    }
    fence_proxy_async_shared();
    __syncthreads();
    const uint64_t s = Swizzled128::k_major(tile + L::s);
    // dO's fragments (rows g, g + 8 at columns t, t + 4 of k-step ks): element (r, e) of a box at
    // byte r 128 + ((2 e / 16) ^ (r % 8)) 16 + 2 e % 16 under the swizzle.
    auto d_o_fragments = [&](uint32_t(&a)[L::kCols / 8][4]) {
      const char* const box = smem + L::d_o + i / 2 * L::kDoBox;
      auto d_o = [&](int r, int e) {
        const int at = r * 128 + ((e / 8) ^ (r % 8)) * 16 + e % 8 * 2;
        return __float_as_uint(__bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(box + at)));
      };
#pragma unroll
      for (int ks = 0; ks < L::kCols / 8; ++ks) {
        const int e = i % 2 * L::kCols + 8 * ks + t;
        a[ks][0] = d_o(row0 + g, e);
        a[ks][1] = d_o(row0 + g + 8, e);
        a[ks][2] = d_o(row0 + g, e + 4);
        a[ks][3] = d_o(row0 + g + 8, e + 4);
      }
    };
    if (group == 0) {
      uint32_t a[L::kCols / 8][4];
      d_o_fragments(a);
      products(acc, [&](int ks) { wgmma_tf32_rs(acc, a[ks], Swizzled128::plus(s, 32 * ks)); });
    } else if (group == 1) {
      const uint64_t delta = Swizzled128::k_major(tile + L::delta), ds = Swizzled128::k_major(tile + L::ds);
      products(acc, [&](int ks) {
        wgmma_tf32(acc, Swizzled128::plus(delta, 32 * ks), Swizzled128::plus(ds, 32 * ks));
      });
    } else if (group == 2) {
      const uint64_t d_delta = Swizzled128::k_major(tile + L::d_delta);
      products(acc, [&](int ks) {
        wgmma_tf32(acc, Swizzled128::plus(d_delta, 32 * ks), Swizzled128::plus(s, 32 * ks));
      });
    } else {
      uint32_t a[L::kCols / 8][4];
      d_o_fragments(a);
      const uint64_t delta = Swizzled128::k_major(tile + L::delta);
      products(d_p, [&](int ks) { wgmma_tf32_rs(d_p, a[ks], Swizzled128::plus(delta, 32 * ks)); });
      // The carry, state row d: its 16-byte chunks x at x ^ (d % 8) under the swizzle, in column order.
      const int d = tid - 3 * 128;
#pragma unroll
      for (int x = 0; x < 8; ++x) {
        const int at = d * 128 + (x ^ (d % 8)) * 16;
        const float4 sv = *reinterpret_cast<const float4*>(tile + L::s + at);
        const float4 dv = *reinterpret_cast<const float4*>(tile + L::ds + at);
        row_sum += sv.x * dv.x + sv.y * dv.y + sv.z * dv.z + sv.w * dv.w;
      }
    }
  }
  __syncthreads();  // every tile is consumed
  if (group == 3) {
    carry[tid - 3 * 128] = row_sum;
    const ForwardParams& f = params.p.fwd;
    float* const dP = params.p.ws.dP + (c.first_row * f.HV + head) * C;
    const int64_t row_stride = static_cast<int64_t>(f.HV) * C;
    for_each_acc_pair(d_p, [&](int r, int col, float2 x) {  // col even: 8-byte aligned pairs
      const int row = row0 + r;
      if (row >= l) return;
      *reinterpret_cast<float2*>(dP + row * row_stride + col) =
          make_float2(col <= row ? f.scale * x.x : 0.f, col + 1 <= row ? f.scale * x.y : 0.f);
    });
    return;
  }
  float* const out = group == 0 ? B0 : group == 1 ? B1 : B2;
  for_each_acc(acc, [&](int r, int col, float x) { out[(row0 + r) * ldb + col] = x; });
}

}  // namespace fkt::cuda
