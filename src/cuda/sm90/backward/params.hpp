// Arguments shared by the CUDA backward stages B1 to B8 (kda-math.md section 4).
#pragma once

#include <cstdint>

#include "core/carver.hpp"
#include "core/problem.hpp"
#include "cuda/sm90/forward/params.hpp"

namespace fkt::cuda {

// What the backward stages hand to each other; every row index is a (token, value head) row
// (b * T + t) * HV + head unless said otherwise. fp32 throughout, except that with bf16 inputs
// B3 hands dA and, where B4 writes dq and dk itself, its dq and dk partials to B4 in bf16
// (backward/handoffs.cuh), each row in the first half of its fp32 slot. Arrays reuse forward
// intermediates that are dead by the time they are first written (stage order B0, B1, ..., B8):
// dA takes P (last read by B1, or by B2 on wgmma) where the workspace holds it (keep_forward, the
// summaries; a recomputing backward reads the forward's saved P, which it leaves as it is), dq
// Q_up's region, dk the region of W and K_down (last read by B2), and dgamma K_down's half of it
// when the operands are fp32 (with bf16 ones dk fills it).
struct BackwardWorkspace {
  float* dP;                // [B*T, HV, C] gradient of M_qk (scale folded in), lower triangle (B1; B3 on wgmma)
  float* dA;                // [B*T, HV, C] gradient of A, strictly lower (B3; bf16 rows with bf16 inputs)
  float* d_delta;           // [B*T, HV, V] intra part (B1), then total (B2; all of it on wgmma)
  void* d_states;           // [chunks, HV, K, V] gradient of the state leaving each chunk (B2), fp32; where
                            // B2 runs on wgmma, fp16 (in the first half of the region) with a scale per
                            // (state row, 64-column V-tile) in d_state_scales, as the states (fwd.half_states)
  float* d_state_scales;    // as the states' (state_scales_at); carved with fwd.half_states
  float* dq;                // [B*T, HV, K] gradient of q_hat of each value head (B3, B4); in Q_up's place
  float* dk;                // [B*T, HV, K] gradient of k_hat of each value head (B3, B4); in W's place
  float* dgamma;            // [B*T, HV, K] gradient of gamma (B3, B4); in K_down's place for fp32 operands
  float* dbeta;             // [B*T, HV] gradient of the activated beta (B3, B4)
  double* dA_log_parts;     // [chunks, HV] partial sums of dA_log per chunk (B7; with the gate in the kernel)
  double* ddt_bias_parts;   // [chunks, HV, K] the same of ddt_bias

  // fwd: a layout with operands of operand_bytes whose Q_up region holds fp32 rows (for_backward,
  // or fp32 operands).
  static BackwardWorkspace carve(Carver& m, const Problem& p, const ForwardWorkspace& fwd, int operand_bytes) {
    const int64_t rows = p.B * p.T * p.HV, chunks = ForwardWorkspace::chunks(p);
    BackwardWorkspace w{};
    w.dP = m.take<float>(rows * p.chunk);
    w.dA = fwd.recompute ? m.take<float>(rows * p.chunk) : static_cast<float*>(fwd.P);
    w.d_delta = m.take<float>(rows * p.V);
    w.d_states = m.take<float>(chunks * p.HV * p.K * p.V);
    if (fwd.half_states) w.d_state_scales = m.take<float>(state_scales_at(chunks * p.HV, 0, p.V, p.K));
    w.dq = static_cast<float*>(fwd.q_up);
    w.dk = static_cast<float*>(fwd.W);
    w.dgamma = operand_bytes == sizeof(float) ? static_cast<float*>(fwd.k_down) : m.take<float>(rows * p.K);
    w.dbeta = m.take<float>(rows);
    if (p.gate != GateMode::kPrecomputed) {  // bwd_gate writes them only then
      w.dA_log_parts = m.take<double>(chunks * p.HV);
      w.ddt_bias_parts = m.take<double>(chunks * p.HV * p.K);
    }
    return w;
  }
};

struct BackwardParams {
  ForwardParams fwd;           // inputs, shapes and the recomputed forward workspace (fwd.o unused)
  BackwardWorkspace ws;
  const void* d_o;             // [B, T, HV, V] contiguous, d_o_dtype
  const float* d_final_state;  // like the final state; may be nullptr
  // B4 writes dq and dk themselves: one value head per query/key head and no l2norm chain leave
  // nothing for B5 / B8's q, k half (bwd_prepare, then not launched).
  bool qk_in_intra;
  // Outputs; each may be nullptr (not requested). Dtypes are those of the matching input.
  void* dq;                    // [B, T, H, K]
  void* dk;                    // [B, T, H, K]
  void* dv;                    // [B, T, HV, V]
  void* dg;                    // [B, T, HV, K]
  void* dbeta;                 // [B, T, HV]
  void* dA_log;                // [HV]
  void* ddt_bias;              // [HV * K]
  float* dh0;                  // like the initial state
  int64_t chunks;              // the chunks of the call or part: the rows of the partials bwd_params sums
  DType d_o_dtype, dv_dtype, dbeta_dtype, dA_log_dtype, ddt_bias_dtype;
};

}  // namespace fkt::cuda
