// Arguments of the F1 kernel (gate activation + chunk-local cumsum, kda-math.md section 3.3).
#pragma once

#include <cstdint>

#include "core/problem.hpp"

namespace fkt::cuda {

struct GateCumsumParams {
  const void* g;           // [B, T, HV, K] contiguous; bf16, fp16 or fp32 (the kernel's template type)
  const void* A_log;       // [HV] in A_log_dtype; nullptr when absent or unused (GateMode::kPrecomputed)
  const void* dt_bias;     // [HV * K] in dt_bias_dtype; nullptr when absent or unused
  const void* cu_seqlens;  // [N + 1] device offsets, int32 or int64 (the kernel's template type); nullptr dense
  float* gamma;            // [B, T, HV, K] contiguous fp32: chunk-local inclusive cumsum, natural log
  DType A_log_dtype;
  DType dt_bias_dtype;
  GateMode gate;
  float lower_bound;       // lambda of GateMode::kBoundedSigmoid
  int64_t T;               // tokens per batch row
  int64_t N;               // sequences (varlen only)
  int64_t chunks_per_row;  // ceil(T / chunk) (dense only)
  int32_t columns;         // HV * K: the elements of one token row
  int32_t K;
  int32_t chunk;           // chunk size C
};

}  // namespace fkt::cuda
