// Arguments shared by the CUDA forward stages F2 to F5 (kda-math.md section 3).
#pragma once

#include <cstdint>

#include "core/problem.hpp"
#include "cuda/sm90/forward/workspace.hpp"
#include "cuda/sm90/fwd_gate_cumsum/params.hpp"

namespace fkt::cuda {

struct ForwardParams {
  const void* q;              // [B, T, H, K] contiguous, qk_dtype
  const void* k;              // [B, T, H, K] contiguous, qk_dtype
  const void* v;              // [B, T, HV, V] contiguous, v_dtype
  const void* beta;           // [B, T, HV] contiguous, beta_dtype (raw logits with BetaMode::kSigmoid*)
  GateInputs gate;            // g and its parameters: F1 inside F2, and B7
  const float* initial_state; // [N, HV, K, V] ([N, HV, V, K] if state_v_first); may be nullptr
  const void* cu_seqlens;     // [N + 1] device offsets in offsets_dtype; nullptr when dense
  void* o;                    // [B, T, HV, V] contiguous, o_dtype
  float* final_state;         // like initial_state; may be nullptr
  void* intermediate_states;  // [B, NT, HV, K, V] (or V, K) in o_dtype; may be nullptr
  ForwardWorkspace ws;
  DType qk_dtype, v_dtype, beta_dtype, o_dtype, offsets_dtype;
  BetaMode beta_mode;
  bool l2norm;
  bool state_v_first;
  float scale;
  int64_t T, N;
  int64_t chunks_per_row;     // ceil(T / C): chunks of one dense batch row
  int32_t H, HV, K, V, chunk;
  // Heads between the token rows of the inputs as given (q, k: io_H; v, beta, g, the states:
  // io_HV), and of the backward's dO and gradients: the call's. Larger than H and HV when the
  // backward runs on a group of the heads (backward/head_groups.hpp: the pointers at the group's
  // first head, the workspace the group's alone). The forward's own outputs (o, intermediate_states)
  // are written with io_H == H and io_HV == HV only.
  int32_t io_H, io_HV;
};

}  // namespace fkt::cuda
