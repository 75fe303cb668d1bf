// What the forward keeps for a recomputing backward (`saved`, c_api.h; docs/design.md, "What
// backward needs from forward"): the fp32 states entering the time segments but the first
// (segments.hpp), and T = (I + A)^-1 and P of every chunk, so that the backward's recompute (B0)
// skips P, A and the inverse. One layout for sizing and for the run. With keep_forward the
// forward's workspace holds T and P, and nothing is saved.
#pragma once

#include <cstdint>

#include "core/carver.hpp"
#include "core/problem.hpp"
#include "cuda/sm90/segments.hpp"

namespace fkt::cuda {

struct SavedLayout {
  float* segment_states;  // [segments - 1, N, HV, K, V]
  float* T;               // [B*T, HV, C] fp32, rows of the inputs as given (b * T + t) * HV + head
  void* P;                // [B*T, HV, C] the same rows, of operand_bytes (ForwardWorkspace::P_dtype):
                          // the forward's F2 writes it as its F4 or F5 reads it

  static SavedLayout carve(Carver& m, const Problem& p, int operand_bytes) {
    SavedLayout s{};
    if (p.keep_forward) return s;
    const int64_t rows = p.B * p.T * p.HV;
    s.segment_states = m.take<float>((time_segments(p).count - 1) * segment_state_elements(p));
    s.T = m.take<float>(rows * p.chunk);
    s.P = m.take<char>(rows * p.chunk * operand_bytes);
    return s;
  }
};

}  // namespace fkt::cuda
