// The parameter gradients on CUDA, one thread per (value head, d) for ddt_bias and, past those, one
// per value head for dA_log (in warps of their own where HV * K is a multiple of 32, so that the
// two sums run side by side, not one after the other in a warp): each the sum of bwd_gate's
// per-chunk fp64 partials over the chunks in ascending order, so the result does not depend on
// scheduling (the CPU sums per-sequence partials in sequence order the same way).
#pragma once

#include "cuda/common/convert.cuh"
#include "cuda/sm90/backward/params.hpp"

namespace fkt::cuda {

struct BwdParamsConfig {
  static constexpr int kThreads = 128;  // grid: ceil(HV * (K + 1) / kThreads)
  // Partials loaded before they are added, so a sum waits on one load latency per batch instead of
  // one per chunk (0.11 ms at B2_T16384_H16's 512 chunks a sequence); the order of the adds stays.
  static constexpr int kBatch = 8;
  static size_t smem_bytes(int, int, int) { return 0; }
};

// sum_{c < chunks} parts[c * stride] in ascending c, the loads of a whole batch issued together
// (unconditional: predicated loads were scheduled one per add), then the rest one by one.
__device__ __forceinline__ double sum_in_order(const double* parts, int64_t stride, int64_t chunks) {
  constexpr int kBatch = BwdParamsConfig::kBatch;
  double sum = 0.0;
  int64_t c = 0;
  for (; c + kBatch <= chunks; c += kBatch) {
    double x[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) x[u] = parts[(c + u) * stride];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) sum += x[u];
  }
  for (; c < chunks; ++c) sum += parts[c * stride];
  return sum;
}

// A parameter gradient leaves as its fp64 sum: unrounded into an fp64 output, as the CPU stores it,
// else rounded through fp32 like every other output.
__device__ __forceinline__ void store_param_grad(void* base, DType dtype, int64_t i, double x) {
  if (dtype == DType::kF64) static_cast<double*>(base)[i] = x;
  else store_float(base, dtype, i, static_cast<float>(x));
}

__global__ void __launch_bounds__(BwdParamsConfig::kThreads) bwd_params_kernel(const __grid_constant__ BackwardParams p) {
  const ForwardParams& f = p.fwd;
  // head * K + d, then the HV heads of dA_log: HV * (K + 1) fits in 32 bits (HV <= 65535, K <= 256).
  const int columns = f.HV * f.K;
  const int column = blockIdx.x * BwdParamsConfig::kThreads + threadIdx.x;
  const int64_t chunks = p.chunks;
  if (column < columns) {
    if (p.ddt_bias) {
      store_param_grad(p.ddt_bias, p.ddt_bias_dtype, column, sum_in_order(p.ws.ddt_bias_parts + column, columns, chunks));
    }
  } else if (const int head = column - columns; head < f.HV && p.dA_log) {
    store_param_grad(p.dA_log, p.dA_log_dtype, head, sum_in_order(p.ws.dA_log_parts + head, f.HV, chunks));
  }
}

}  // namespace fkt::cuda
