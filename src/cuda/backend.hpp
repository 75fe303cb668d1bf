// Entry points of the CUDA backend that the core registry calls.
#pragma once

#include "core/problem.hpp"

namespace fkt::cuda {

// True when the library was built with CUDA kernels.
bool built();
// Throws fkt::Error naming what the CUDA backend does not support for p.
void check_supported(const Problem& p);

// F1 alone (the fkt_stage_gate_cumsum test hook): gamma [B, T, HV, K] fp32 on p.device, enqueued on
// `stream`. cu_seqlens_device holds the offsets of p.cu_seqlens on the device (read when p.varlen).
void fwd_gate_cumsum(const Problem& p, const fkt_tensor* cu_seqlens_device, float* gamma, void* stream);

}  // namespace fkt::cuda
