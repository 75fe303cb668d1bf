// Arguments shared by the CUDA forward stages F2 to F5 (kda-math.md section 3).
#pragma once

#include <cstdint>

#include "core/problem.hpp"
#include "cuda/sm90/forward/workspace.hpp"
#include "cuda/sm90/fwd_gate_cumsum/params.hpp"

namespace fkt::cuda {

// ForwardParams::piece_end of a launch that takes every chunk.
constexpr int64_t kNoPieceEnd = INT64_MAX;

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
  // [segments - 1, N, HV, K, V] (or V, K) fp32: the state entering each time segment but the first
  // (sm90/segments.hpp), which F4 writes when set; may be nullptr.
  float* segment_states;
  ForwardWorkspace ws;
  DType qk_dtype, v_dtype, beta_dtype, o_dtype, offsets_dtype;
  BetaMode beta_mode;
  bool l2norm;
  bool state_v_first;
  float scale;
  int64_t T, N;
  int64_t chunks_per_row;     // ceil(T / C): chunks of one dense batch row
  int64_t segment_chunks;     // chunks of a time segment (with segment_states)
  // The chunks of every sequence that this launch of F2 and F4 takes, [piece_begin, piece_end): all
  // of them (0, kNoPieceEnd) but in a forward in pieces (forward/pieces.hpp, dense inputs only),
  // where F4 starts from initial_state and leaves its state in final_state, both the pieces' carry
  // between pieces. In time slices, F4's slice z takes the z-th span of that length
  // (FwdStateWgmmaParams::slices).
  int64_t piece_begin, piece_end;
  int32_t H, HV, K, V, chunk;
  // Heads between the token rows of the inputs as given (q, k: io_H; v, beta, g, the states:
  // io_HV), and tokens between their batch rows (io_T), with the backward's dO and gradients: the
  // call's. Larger than H, HV and T when the backward runs on a group of the heads
  // (backward/views.hpp) or on a time segment (sm90/segments.hpp): the pointers at the
  // group's first head or the segment's first token, the workspace the group's or the segment's
  // alone. A sequence group (sm90/sequence_groups.hpp) has the call's heads and, being one batch
  // row, its own T as io_T. The forward's own outputs (o, intermediate_states) are written with
  // io_H == H, io_HV == HV and io_T == T only.
  int64_t io_T;
  int32_t io_H, io_HV;
};

}  // namespace fkt::cuda
