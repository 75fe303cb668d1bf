// The parameter gradients on CUDA, one thread per (value head, d): dA_log and ddt_bias are the sums
// of bwd_gate's per-chunk fp64 partials over the chunks in ascending order, so the result does not
// depend on scheduling (the CPU sums per-sequence partials in sequence order the same way).
#pragma once

#include "cuda/common/convert.cuh"
#include "cuda/sm90/backward/params.hpp"

namespace fkt::cuda {

struct BwdParamsConfig {
  static constexpr int kThreads = 128;  // grid: ceil(HV * K / kThreads)
  static size_t smem_bytes(int, int, int) { return 0; }
};

// A parameter gradient leaves as its fp64 sum: unrounded into an fp64 output, as the CPU stores it,
// else rounded through fp32 like every other output.
__device__ __forceinline__ void store_param_grad(void* base, DType dtype, int64_t i, double x) {
  if (dtype == DType::kF64) static_cast<double*>(base)[i] = x;
  else store_float(base, dtype, i, static_cast<float>(x));
}

__global__ void __launch_bounds__(BwdParamsConfig::kThreads) bwd_params_kernel(const __grid_constant__ BackwardParams p) {
  const ForwardParams& f = p.fwd;
  // head * K + d; HV * K fits in 32 bits (HV <= 65535, K <= 256), which keeps the divisions 32-bit.
  const int columns = f.HV * f.K;
  const int column = blockIdx.x * BwdParamsConfig::kThreads + threadIdx.x;
  if (column >= columns) return;
  const int64_t chunks = f.cu_seqlens == nullptr ? f.N * f.chunks_per_row : f.ws.chunk_offsets[f.N];
  if (p.ddt_bias) {
    double sum = 0.0;
    for (int64_t c = 0; c < chunks; ++c) sum += p.ws.ddt_bias_parts[c * columns + column];
    store_param_grad(p.ddt_bias, p.ddt_bias_dtype, column, sum);
  }
  if (p.dA_log && column % f.K == 0) {
    const int head = column / f.K;
    double sum = 0.0;
    for (int64_t c = 0; c < chunks; ++c) sum += p.ws.dA_log_parts[c * f.HV + head];
    store_param_grad(p.dA_log, p.dA_log_dtype, head, sum);
  }
}

}  // namespace fkt::cuda
