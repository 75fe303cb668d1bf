// The forward in pieces (docs/design.md, "The forward in pieces"): where F4's blocks (sequences x
// value heads x V-tiles) leave most SMs idle, the chunks of every batch row are cut into consecutive
// pieces, run in one of two ways:
// - one after another: F2 of each piece on the caller's stream and F4 of each on a side stream once
//   F2 of the same piece has run, so that F4 of piece s runs beside F2 of piece s + 1. F4 of a piece
//   starts from the state the previous piece's F4 left in the carry (the initial state for the
//   first) and leaves its own there (the final state for the last): the chunks and the fp32 state
//   are those of one pass, so the results are the same bits.
// - side by side, as time slices, where F4's blocks are fewer still: F2 of every chunk, then the
//   summary of each slice but the last (the affine map of its entering state onto its leaving one,
//   F4 on V + K columns: fwd_state_wgmma's SliceSummary), an exact scan over the summaries for the
//   state entering each slice (the context-parallel fold), and F4 of every slice at once from its
//   state. The same recurrence, with the states between slices summed in another order: results
//   within fp32 rounding of one pass, not its bits.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/problem.hpp"
#include "cuda/common/device_limits.hpp"
#include "cuda/common/round_up.hpp"
#include "cuda/sm90/forward/workspace.hpp"

namespace fkt::cuda {

struct ForwardPieces {
  int64_t count = 1;    // pieces
  int64_t chunks = 0;   // chunks of a batch row that each piece but the last takes
  bool slices = false;  // side by side (time slices), else one after another
};

// The planner's choice: time slices of at least sixteen chunks each where F4's grid takes at most a
// quarter of the SMs, as many as keep the summaries' grid (twice F4's per slice) within the SMs, up
// to eight, and at least three: k slices walk about 2 / k of the chunk steps one after another (the
// summaries of a slice, then F4 of one), so two would save none and add the summaries' and the
// fold's launches. Else four pieces one after another, of at least sixteen chunks each, where F4's
// grid takes at most half the SMs. An earlier build of the pieces' plan on the H200 (design.md): four
// pieces took B2_T16384_H16's forward 1.32 -> 1.17 ms of GPU time, eight 1.24; F4 grids that fill
// the GPU, or short pieces, took longer.
constexpr int64_t kPlannedPieces = 4, kLeastPlannedPieceChunks = 16, kLeastSlices = 3, kMostSlices = 8;

// The pieces of p's forward, whose workspace is `ws` and whose F4 launches `f4_blocks` blocks: with
// F4 on wgmma with F5 inside (the forward's own layout at the common shape with bf16 products) over
// dense inputs, one after another as asked (fkt_options::forward_pieces), or the planner's choice;
// one piece otherwise.
inline ForwardPieces forward_pieces(const Problem& p, const ForwardWorkspace& ws, int64_t f4_blocks) {
  const int64_t chunks = ceil_div(p.T, p.chunk);
  const ForwardPieces whole{1, chunks};
  if (p.varlen || !ws.output_in_state_pass || p.forward_pieces == 0 || p.forward_pieces == 1 || f4_blocks == 0) {
    return whole;
  }
  int64_t wanted = p.forward_pieces;
  bool slices = false;
  if (wanted < 0) {
    const int64_t sms = device_limits(p.device.device_id).sms;
    slices = 4 * f4_blocks <= sms && chunks >= kLeastSlices * kLeastPlannedPieceChunks;
    if (slices) {
      wanted = std::min({kMostSlices, chunks / kLeastPlannedPieceChunks, 1 + sms / (2 * f4_blocks)});
    } else {
      if (2 * f4_blocks > sms) return whole;
      wanted = std::min(kPlannedPieces, chunks / kLeastPlannedPieceChunks);
    }
  }
  if (wanted < 2 || chunks < 2) return whole;
  const int64_t length = ceil_div(chunks, static_cast<int>(std::min(wanted, chunks)));
  return {ceil_div(chunks, static_cast<int>(length)), length, slices};
}

}  // namespace fkt::cuda
