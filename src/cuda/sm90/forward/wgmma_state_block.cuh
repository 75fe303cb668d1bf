// Where a block of a wgmma state pass (fwd_state_wgmma, bwd_state_wgmma) works, at the common shape
// (C = 64, K = V = 128): grid x = sequence * (V / kTile) + V-tile, y = value head; two warpgroups of
// four warps, warpgroup h holding state rows 64h .. 64h + 63 at all kTile columns and, of the
// products over the chunk's rows, the columns kTile / 2 h onwards.
#pragma once

#include <cstdint>

#include "cuda/common/mma.cuh"
#include "cuda/common/round_up.hpp"
#include "cuda/common/vec4.cuh"
#include "cuda/sm90/dims.hpp"
#include "cuda/sm90/forward/chunks.cuh"

namespace fkt::cuda {

template <int kTile>
struct WgmmaStateBlock {
  static constexpr int kC = CommonDims::chunk(ForwardParams{}), kV = CommonDims::v(ForwardParams{});
  static constexpr int kTiles = kV / kTile;
  static_assert(kV % kTile == 0, "whole V-tiles");
  int64_t n;            // the sequence
  int head, e0;         // the value head, the V-tile's first column
  SequenceSpan seq;
  int half;             // the warpgroup
  int row0, crow0;      // the warp's first state row, its first chunk row
  int64_t chunks;
  int64_t first, step;  // (token, head) rows: the sequence's first, and a chunk's advance
  int64_t first_state;  // the chunk row of the sequence's first state
  int64_t row_stride;   // elements between the rows of a [B*T, HV, V] tensor

  __device__ explicit WgmmaStateBlock(const ForwardParams& p)
      : n(blockIdx.x / kTiles),
        head(blockIdx.y),
        e0(static_cast<int>(blockIdx.x % kTiles) * kTile),
        seq(sequence_span(p, n)),
        half(threadIdx.x / 128),
        row0(64 * half + 16 * (threadIdx.x / 32 % 4)),
        crow0(16 * (threadIdx.x / 32 % 4)),
        chunks(ceil_div(seq.length, kC)),
        first(seq.first_row * p.HV + head),
        step(static_cast<int64_t>(kC) * p.HV),
        first_state(seq.first_chunk * p.HV + head),
        row_stride(static_cast<int64_t>(p.HV) * kV) {}

  // The valid rows of chunk j.
  __device__ int rows_of(int64_t j) const {
    return static_cast<int>(min(static_cast<int64_t>(kC), seq.length - j * kC));
  }

  // Chunk j's rows of a [B*T, HV, V] fp32 tensor, given at this block's first row and V-tile, into
  // registers in the layout of the warpgroup's accumulator over the chunk's rows (the warp's rows,
  // the warpgroup's columns); rows past the chunk's end are zero.
  template <int N>
  __device__ void load_chunk_rows(float (&acc)[N][4], const float* tile, int64_t j) const {
    const int l = rows_of(j);
#pragma unroll
    for (int t = 0; t < N; ++t) {
#pragma unroll
      for (int i = 0; i < 4; i += 2) {
        const int row = crow0 + acc_row(i);
        const float2 x = row < l ? load2(tile + j * step * kV + row * row_stride + kTile / 2 * half + acc_col(t, i))
                                 : make_float2(0.f, 0.f);
        acc[t][i] = x.x;
        acc[t][i + 1] = x.y;
      }
    }
  }
};

}  // namespace fkt::cuda
