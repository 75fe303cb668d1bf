// Entry points of the CUDA backend that the core registry calls.
#pragma once

#include <cstdint>

#include "core/problem.hpp"

namespace fkt::cuda {

// True when the library was built with CUDA kernels.
bool built();
// Throws fkt::Error naming what the CUDA backend does not support for p.
void check_supported(const Problem& p);

uint64_t forward_workspace_bytes(const Problem& p);
uint64_t backward_workspace_bytes(const Problem& p);
// The forward F1 to F5 and the backward B0 to B8 on `stream` (no allocation, copy or synchronisation).
void forward(const Problem& p, const fkt_forward_outputs& out, void* stream);
void backward(const Problem& p, const fkt_backward_io& io, void* stream);

// F1 alone (also the fkt_stage_gate_cumsum test hook): gamma [B, T, HV, K] fp32 on p.device,
// enqueued on `stream`.
void fwd_gate_cumsum(const Problem& p, float* gamma, void* stream);

}  // namespace fkt::cuda
