// Entry points of the CUDA backend that the core registry calls.
#pragma once

#include <cstdint>

#include "core/problem.hpp"

namespace fkt::cuda {

// True when the library was built with CUDA kernels.
bool built();
// Throws fkt::Error naming what the CUDA backend does not support for p.
void check_supported(const Problem& p);

// `saving`: the forward is given `saved` (fkt_sizes.saving_forward_workspace_bytes).
uint64_t forward_workspace_bytes(const Problem& p, bool saving);
uint64_t backward_workspace_bytes(const Problem& p);
// What the forward keeps for the backward in `saved` (c_api.h): T, P and the time segments' entering
// states (sm90/saved.hpp).
uint64_t saved_bytes(const Problem& p);
// The forward F1 to F5 and the backward B0 to B8 on `stream` (no allocation, copy or synchronisation).
void forward(const Problem& p, const fkt_forward_outputs& out, void* stream);
void backward(const Problem& p, const fkt_backward_io& io, void* stream);

// Context parallelism (kda-math.md section 9, fkt_cp_* in c_api.h), enqueued on `stream`: the
// summaries of sequence `sequence` into a contiguous fp32 summary [HV, K, V + K] using `workspace`
// (of the size named), and the fold of contiguous fp32 summaries [R, HV, K, V + K] into one state.
uint64_t cp_forward_summary_workspace_bytes(const Problem& p);
uint64_t cp_backward_summary_workspace_bytes(const Problem& p);
void cp_forward_summary(const Problem& p, int64_t sequence, float* summary, char* workspace, void* stream);
void cp_backward_summary(const Problem& p, const fkt_tensor* d_o, int64_t sequence, float* summary, char* workspace,
                         void* stream);
void cp_fold(const float* summaries, int64_t HV, int64_t K, int64_t V, int64_t first, int64_t count, bool backward,
             bool state_v_first, float* state, int device_id, void* stream);

// F1 alone (also the fkt_stage_gate_cumsum test hook): gamma [B, T, HV, K] fp32 on p.device,
// enqueued on `stream`.
void fwd_gate_cumsum(const Problem& p, float* gamma, void* stream);

}  // namespace fkt::cuda
