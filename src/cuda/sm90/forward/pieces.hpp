// The forward in pieces (docs/design.md, "The forward in pieces"): where F4's blocks (sequences x
// value heads x V-tiles) leave most SMs idle, the chunks of every batch row are cut into consecutive
// pieces, F2 of each piece runs on the caller's stream and F4 of each on a side stream once F2 of
// the same piece has run, so that F4 of piece s runs beside F2 of piece s + 1. F4 of a piece starts
// from the state the previous piece's F4 left in the carry (the initial state for the first) and
// leaves its own there (the final state for the last): the chunks and the fp32 state are those of
// one pass, so the results are the same bits.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/problem.hpp"
#include "cuda/common/device_limits.hpp"
#include "cuda/common/round_up.hpp"
#include "cuda/sm90/forward/workspace.hpp"

namespace fkt::cuda {

struct ForwardPieces {
  int64_t count = 1;   // pieces
  int64_t chunks = 0;  // chunks of a batch row that each piece but the last takes
};

// The planner's choice: four pieces of at least sixteen chunks each where F4's grid takes at most
// half the SMs. An earlier build of the same plan on the H200 (design.md): four pieces took
// B2_T16384_H16's forward 1.32 -> 1.17 ms of GPU time, eight 1.24; F4 grids that fill the GPU, or
// short pieces, took longer.
constexpr int64_t kPlannedPieces = 4, kLeastPlannedPieceChunks = 16;

// The pieces of p's forward, whose workspace is `ws` and whose F4 launches `f4_blocks` blocks: F4 on
// wgmma with F5 inside (the forward's own layout at the common shape with bf16 products) over dense
// inputs; one piece otherwise.
inline ForwardPieces forward_pieces(const Problem& p, const ForwardWorkspace& ws, int64_t f4_blocks) {
  const int64_t chunks = ceil_div(p.T, p.chunk);
  const ForwardPieces whole{1, chunks};
  if (p.varlen || !ws.output_in_state_pass || p.forward_pieces == 0 || p.forward_pieces == 1) return whole;
  int64_t wanted = p.forward_pieces;
  if (wanted < 0) {
    if (2 * f4_blocks > device_limits(p.device.device_id).sms) return whole;
    wanted = std::min(kPlannedPieces, chunks / kLeastPlannedPieceChunks);
  }
  if (wanted < 2 || chunks < 2) return whole;
  const int64_t length = ceil_div(chunks, static_cast<int>(std::min(wanted, chunks)));
  return {ceil_div(chunks, static_cast<int>(length)), length};
}

}  // namespace fkt::cuda
