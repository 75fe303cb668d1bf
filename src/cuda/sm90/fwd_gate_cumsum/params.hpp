// Arguments of F1 (gate activation + chunk-local cumsum, kda-math.md section 3.3): the raw gate and
// its parameters, which F2 (fwd_intra, where F1 runs on the run path) and B7 read too, and those
// of the F1 kernel alone (the stage hook's).
#pragma once

#include <cstdint>

#include "core/problem.hpp"

namespace fkt::cuda {

struct GateInputs {
  const void* g;        // [B, T, HV, K] contiguous; bf16, fp16 or fp32 (g_dtype)
  const void* A_log;    // [HV] in A_log_dtype; nullptr when absent or unused (GateMode::kPrecomputed)
  const void* dt_bias;  // [HV * K] in dt_bias_dtype; nullptr when absent or unused
  DType g_dtype, A_log_dtype, dt_bias_dtype;
  GateMode mode;
  float lower_bound;    // lambda of GateMode::kBoundedSigmoid
};

// make_problem leaves A_log and dt_bias absent unless the gate is activated in the kernel.
inline GateInputs gate_inputs(const Problem& p) {
  GateInputs in{};
  in.g = p.g.bytes();
  in.A_log = p.A_log.present() ? p.A_log.bytes() : nullptr;
  in.dt_bias = p.dt_bias.present() ? p.dt_bias.bytes() : nullptr;
  in.g_dtype = p.g.dtype;
  in.A_log_dtype = p.A_log.dtype;
  in.dt_bias_dtype = p.dt_bias.dtype;
  in.mode = p.gate;
  in.lower_bound = static_cast<float>(p.lower_bound);
  return in;
}

struct GateCumsumParams {
  GateInputs gate;
  const void* cu_seqlens;  // [N + 1] device offsets, int32 or int64 (the kernel's template type); nullptr dense
  float* gamma;            // [B, T, HV, K] contiguous fp32: chunk-local inclusive cumsum, natural log
  int64_t T;               // tokens per batch row
  int64_t N;               // sequences (varlen only)
  int64_t chunks_per_row;  // ceil(T / chunk) (dense only)
  int32_t columns;         // HV * K: the elements of one token row
  int32_t K;
  int32_t chunk;           // chunk size C
};

}  // namespace fkt::cuda
