// Where a block of a wgmma state pass (fwd_state_wgmma, bwd_state_wgmma) works, at the common shape
// (C = 64, K = V = 128), on a grid of x = sequences * (kColumns / kTile) column tiles, y = value
// heads. The columns are the state's V, or V + K for the summaries of time slices
// (forward/pieces.hpp). Dense rows: x = sequence * (kColumns / kTile) + column tile, y = value
// head. Varlen: blocks start roughly in launch order (x fastest), and a block walks its sequence's
// chunks, so the blocks in launch order take the sequences longest first
// (ForwardWorkspace::sequence_order), then the value heads, then the tiles: the last blocks to
// start are the shortest, not long sequences left for few SMs.
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

  __device__ explicit WgmmaStateBlock(const ForwardParams& p) : WgmmaStateBlock(p, place(p)) {}

  // Sequence, value head and column tile of this block.
  struct Place {
    int64_t n;
    int head, tile;
  };
  __device__ static Place place(const ForwardParams& p) {
    if (p.cu_seqlens == nullptr) {
      return {blockIdx.x / kTiles, static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.x % kTiles)};
    }
    const int64_t launched = blockIdx.x + static_cast<int64_t>(gridDim.x) * blockIdx.y;
    const int64_t per_sequence = static_cast<int64_t>(gridDim.y) * kTiles;
    const int within = static_cast<int>(launched % per_sequence);
    return {p.ws.sequence_order[launched / per_sequence], within / kTiles, within % kTiles};
  }

  __device__ WgmmaStateBlock(const ForwardParams& p, Place at)
      : n(at.n),
        head(at.head),
        e0(at.tile * kTile),
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
