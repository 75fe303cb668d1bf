// Launch shape of the F1 kernel.
#pragma once

namespace fkt::cuda {

struct GateCumsumConfig {
  // One thread per column (value head, d) of a token row: consecutive threads touch consecutive
  // elements, so every load of g and store of gamma by a warp is one coalesced run. Each thread
  // scans its column down a chunk; blockIdx.y picks the group of columns.
  static constexpr int kThreads = 128;
  // Rows of g each thread loads before using the first: enough independent loads in flight to
  // cover memory latency with a grid of only (chunks x column groups) blocks.
  static constexpr int kRowsInFlight = 8;
  // Hardware limit of gridDim.y (the column groups).
  static constexpr int kMaxColumnGroups = 65535;
};

}  // namespace fkt::cuda
