// Where a block of a wgmma state pass (fwd_state_wgmma, bwd_state_wgmma) works, at the common shape
// (C = 64, K = V = 128): grid x = sequence * (kColumns / kTile) + column tile, y = value head. The
// columns are the state's V, or V + K for the summaries of time slices (forward/pieces.hpp).
#pragma once

#include <cstdint>

#include "cuda/common/round_up.hpp"
#include "cuda/sm90/dims.hpp"
#include "cuda/sm90/forward/chunks.cuh"

namespace fkt::cuda {

template <int kTile, int kColumns = CommonDims::v(ForwardParams{})>
struct WgmmaStateBlock {
  static constexpr int kC = CommonDims::chunk(ForwardParams{}), kV = CommonDims::v(ForwardParams{});
  static constexpr int kTiles = kColumns / kTile;
  static_assert(kColumns % kTile == 0, "whole column tiles");
  int64_t n;            // the sequence
  int head, e0;         // the value head, the V-tile's first column
  SequenceSpan seq;
  int64_t chunks;
  int64_t first, step;  // (token, head) rows: the sequence's first, and a chunk's advance
  int64_t first_state;  // the chunk row of the sequence's first state
  int64_t row_stride;   // elements between the rows of a [B*T, HV, V] tensor

  __device__ explicit WgmmaStateBlock(const ForwardParams& p)
      : n(blockIdx.x / kTiles),
        head(blockIdx.y),
        e0(static_cast<int>(blockIdx.x % kTiles) * kTile),
        seq(sequence_span(p, n)),
        chunks(ceil_div(seq.length, kC)),
        first(seq.first_row * p.HV + head),
        step(static_cast<int64_t>(kC) * p.HV),
        first_state(seq.first_chunk * p.HV + head),
        row_stride(static_cast<int64_t>(p.HV) * kV) {}

  // Chunk j's first token row in the [B*T, HV, .] tensors that the passes' tensor maps read (32-bit:
  // check_supported bounds B*T).
  __device__ int token(int64_t j) const { return static_cast<int>(seq.first_row + j * kC); }
  // The same in the tensors as given (dO's map).
  __device__ int io_token(int64_t j) const { return static_cast<int>(seq.io_row + j * kC); }

  // The valid rows of chunk j.
  __device__ int rows_of(int64_t j) const {
    return static_cast<int>(min(static_cast<int64_t>(kC), seq.length - j * kC));
  }
};

}  // namespace fkt::cuda
