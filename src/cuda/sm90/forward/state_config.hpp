// Launch shape and shared-memory plans of the state passes (fwd_state, bwd_state).
#pragma once

#include <cstddef>

#include "cuda/common/round_up.hpp"

namespace fkt::cuda {

// What a state pass's kernel is compiled for: threads per block and blocks per SM (a register cap).
// Chosen per call by with_state_residency (sm90/launch.cuh) from the grid's size against the SMs
// and the shared memory a block needs.
template <int kThreadsPerBlock, int kBlocksPerSm>
struct Residency {
  static constexpr int threads = kThreadsPerBlock, blocks_per_sm = kBlocksPerSm;
};

struct StateConfig {
  static constexpr int kThreads = 256;  // a block of one warp per 16 state rows, all kTileV columns
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kTileV = 32;          // state columns per block
  // Row stride of [*, kTileV] buffers: fp32 ones read at accumulator pairs (row g, column 2t), 16-bit
  // ones (bwd_state's dO) read by element, two lanes per word; rows 16-byte multiples (cp.async).
  static constexpr int kLdTile = kTileV + 8;
  // Blocks of a pass: (sequence, value head, V-tile), the V-tiles of one head adjacent in x so that
  // they run together and share the chunk's W, K_down (or K_down, Q_up, W) through L2.
  __host__ __device__ static int tiles(int V) { return ceil_div(V, kTileV); }
  // Columns of the tile a warp holds in a block of `threads`: all kTileV with one warp per 16 state
  // rows (kThreads), 16 with two (2 x kThreads, more products in flight for a grid of few blocks).
  __host__ __device__ static constexpr int warp_cols(int threads) { return kTileV * kThreads / threads; }
  // K rounded up to 16: row group w (one or two warps) holds state rows 16w .. 16w + 15 (K <= 128 =
  // 8 groups x 16).
  __host__ __device__ static int padded(int K) { return round_up<16>(K); }
  // Row strides of shared-memory operands of `extent` columns read in pairs (common/mma_pairs.cuh):
  // 8 (mod 32) with k along the rows, 4 (mod 32) with m or n along them; conflict-free reads.
  __host__ __device__ static int ld_k_rows(int extent) { return round_up<32>(extent) + 8; }
  __host__ __device__ static int ld_mn_rows(int extent) { return round_up<32>(extent) + 4; }
  // Row strides, in elements, of the stored A operands W, K_down, Q_up (Operand in
  // common/mma_pairs.cuh) of `bytes` each: fp32 as above, bf16 8 (mod 64) with k or m along rows.
  __host__ __device__ static int ld_operand(int K, int bytes, bool k_rows) {
    return bytes == 2 ? ld_rows16(K) : k_rows ? ld_k_rows(K) : ld_mn_rows(K);
  }
  // Floats taken by `rows` operand rows (a multiple of 4, keeping the next region 16-byte aligned:
  // ld is a multiple of 8, rows of 16). bf16 rows go by 16-byte cp.async when K is a multiple of
  // 8, else element by element (fp32 ones when K is a multiple of 4).
  __host__ __device__ static int operand_floats(int rows, int K, int bytes, bool k_rows) {
    return rows * ld_operand(K, bytes, k_rows) * bytes / 4;
  }
};

// fwd_state, offsets in floats: W [C, ld_operand] and K_down [C, ld_operand] of `bytes` each,
// U [C, kLdTile], S^T [kTileV, ld_k_rows(K)] (the state, mirrored from registers), delta^T
// [kTileV, ld_k_rows(C)], gamma_L [Kp].
struct FwdStateLayout {
  int w, kd, u, s, delta, g_last, floats;
  __host__ __device__ FwdStateLayout(int C, int K, int operand_bytes) {
    constexpr int kTile = StateConfig::kTileV;
    w = 0;
    kd = w + StateConfig::operand_floats(C, K, operand_bytes, true);
    u = kd + StateConfig::operand_floats(C, K, operand_bytes, false);
    s = u + C * StateConfig::kLdTile;
    delta = s + kTile * StateConfig::ld_k_rows(K);
    g_last = delta + kTile * StateConfig::ld_k_rows(C);
    floats = g_last + StateConfig::padded(K);
  }
  static size_t bytes(int C, int K, int operand_bytes) {
    return sizeof(float) * FwdStateLayout(C, K, operand_bytes).floats;
  }
};

// bwd_state, offsets in floats: K_down [C, ld_operand] of `operand_bytes` each, dS^T [kTileV,
// ld_k_rows(K)] (mirrored from registers), whose room then takes the total d_delta^T [kTileV,
// ld_k_rows(C)], Q_up and W [C, ld_operand], dO [C, ld_d_o] of `d_o_bytes` each, gamma_L [Kp].
// With bf16 operands and dO, 73.5 KB for C = 64, K = 128: three blocks per SM.
struct BwdStateLayout {
  int kd, ds, qu, w, d_o, g_last, floats;
  // dO rows: fp32 4 (mod 32) floats, 16-bit kLdTile elements; 16-byte multiples either way.
  __host__ __device__ static int ld_d_o(int d_o_bytes) {
    return d_o_bytes == 2 ? StateConfig::kLdTile : StateConfig::ld_mn_rows(StateConfig::kTileV);
  }
  __host__ __device__ BwdStateLayout(int C, int K, int operand_bytes, int d_o_bytes) {
    constexpr int kTile = StateConfig::kTileV;
    const int mirror = StateConfig::ld_k_rows(K) > StateConfig::ld_k_rows(C) ? StateConfig::ld_k_rows(K)
                                                                              : StateConfig::ld_k_rows(C);
    kd = 0;
    ds = kd + StateConfig::operand_floats(C, K, operand_bytes, true);
    qu = ds + kTile * mirror;
    w = qu + StateConfig::operand_floats(C, K, operand_bytes, false);
    d_o = w + StateConfig::operand_floats(C, K, operand_bytes, false);
    g_last = d_o + C * ld_d_o(d_o_bytes) * d_o_bytes / 4;
    floats = g_last + StateConfig::padded(K);
  }
  static size_t bytes(int C, int K, int operand_bytes, int d_o_bytes) {
    return sizeof(float) * BwdStateLayout(C, K, operand_bytes, d_o_bytes).floats;
  }
};

}  // namespace fkt::cuda
