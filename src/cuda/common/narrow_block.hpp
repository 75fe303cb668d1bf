// The block size of the chunk kernels that keep 16-bit inputs as given in shared memory (fwd_intra,
// bwd_intra): those tiles take half the room, so two or more blocks of 256 threads share an SM;
// inputs widened to fp32 take the SM with one block of 512.
#pragma once

namespace fkt::cuda {

template <typename Stored>
struct NarrowBlock {
  static constexpr bool kNarrow = sizeof(Stored) == 2;
  static constexpr int kThreads = kNarrow ? 256 : 512;
  static constexpr int kWarps = kThreads / 32;
};

}  // namespace fkt::cuda
