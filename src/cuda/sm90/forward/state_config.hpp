// Launch shape and shared-memory plans of the state passes (fwd_state, bwd_state).
#pragma once

#include <cstddef>

#include "cuda/common/round_up.hpp"

namespace fkt::cuda {

struct StateConfig {
  static constexpr int kThreads = 256;  // fwd_state: warp w holds all kTileV columns of its 16 rows
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kTileV = 32;          // state columns per block
  static constexpr int kLdTile = kTileV + 8;  // [*, kTileV] buffers, read as (row t, column g) B fragments
  // Blocks of a pass: (sequence, value head, V-tile), the V-tiles of one head adjacent in x so that
  // they run together and share the chunk's W, K_down (or K_down, Q_up, W) through L2.
  __host__ __device__ static int tiles(int V) { return (V + kTileV - 1) / kTileV; }
  // bwd_state: its shared memory admits one block per SM, so it runs two warps per 16 rows (16
  // columns each) to keep twice as many products in flight.
  static constexpr int kBwdThreads = 512;
  static constexpr int kBwdWarpCols = kTileV / (kBwdThreads / kThreads);
  // K rounded up to 16: row group w (a warp of fwd_state, two of bwd_state) holds state rows
  // 16w .. 16w + 15 (K <= 128 = 8 groups x 16).
  __host__ __device__ static int padded(int K) { return round_up<16>(K); }
  // Row strides of [C, Kp] operands: 4 (mod 32) when read as (row g, column t) A fragments, 8 (mod 32)
  // when read transposed; both keep the fragment reads free of bank conflicts.
  __host__ __device__ static int ld_rows(int K) { return padded(K) + 4; }
  __host__ __device__ static int ld_transposed(int K) { return padded(K) + 8; }
};

// fwd_state, offsets in floats: W [C, ld_rows], K_down [C, ld_transposed], U [C, kLdTile],
// S [Kp, kLdTile] (the state, mirrored from registers), delta [C, kLdTile], gamma_L [Kp].
struct FwdStateLayout {
  int w, kd, u, s, delta, g_last, floats;
  __host__ __device__ FwdStateLayout(int C, int K) {
    constexpr int ld = StateConfig::kLdTile;
    w = 0;
    kd = w + C * StateConfig::ld_rows(K);
    u = kd + C * StateConfig::ld_transposed(K);
    s = u + C * ld;
    delta = s + StateConfig::padded(K) * ld;
    g_last = delta + C * ld;
    floats = g_last + StateConfig::padded(K);
  }
  static size_t bytes(int C, int K) { return sizeof(float) * FwdStateLayout(C, K).floats; }
};

// bwd_state, offsets in floats: K_down [C, ld_rows], the intra d_delta and the total d_delta
// [C, kLdTile], dS [Kp, kLdTile] (mirrored from registers), Q_up and W [C, ld_transposed],
// s * dO [C, kLdTile], gamma_L [Kp].
struct BwdStateLayout {
  int kd, dd_intra, dd, ds, qu, w, d_o, g_last, floats;
  __host__ __device__ BwdStateLayout(int C, int K) {
    constexpr int ld = StateConfig::kLdTile;
    kd = 0;
    dd_intra = kd + C * StateConfig::ld_rows(K);
    dd = dd_intra + C * ld;
    ds = dd + C * ld;
    qu = ds + StateConfig::padded(K) * ld;
    w = qu + C * StateConfig::ld_transposed(K);
    d_o = w + C * StateConfig::ld_transposed(K);
    g_last = d_o + C * ld;
    floats = g_last + StateConfig::padded(K);
  }
  static size_t bytes(int C, int K) { return sizeof(float) * BwdStateLayout(C, K).floats; }
};

}  // namespace fkt::cuda
