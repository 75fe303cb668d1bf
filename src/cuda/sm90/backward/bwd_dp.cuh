// B1 on CUDA, one block per (chunk, value head): dP = s * tril(dO delta^T) (the gradient of M_qk)
// and the intra part of d_delta, P^T dO.
#pragma once

#include "cuda/common/convert.cuh"
#include "cuda/sm90/backward/params.hpp"
#include "cuda/sm90/forward/chunks.cuh"

namespace fkt::cuda {

struct DpConfig {
  static constexpr int kThreads = 256;
  // fp32 shared memory: dO [C, V], delta [C, V + 1] (odd stride: its rows are walked across
  // threads), P [C, C].
  static size_t smem_bytes(int C, int, int V) { return sizeof(float) * (C * V + C * (V + 1) + C * C); }
};

__global__ void __launch_bounds__(DpConfig::kThreads) bwd_dp_kernel(const __grid_constant__ BackwardParams p) {
  const ForwardParams& f = p.fwd;
  const ChunkSpan c = chunk_span(f, blockIdx.x);
  const int head = blockIdx.y, C = f.chunk, V = f.V, l = static_cast<int>(c.rows);
  extern __shared__ float smem[];
  float* d_o = smem;          // [C, V]
  float* delta = d_o + C * V; // [C, V + 1]
  float* P = delta + C * (V + 1);  // [C, C]
  const int tid = threadIdx.x, nthreads = blockDim.x;
  for (int x = tid; x < l * V; x += nthreads) {
    const int64_t at = ((c.first_row + x / V) * f.HV + head) * V + x % V;
    d_o[x] = load_float(p.d_o, p.d_o_dtype, at);
    delta[x / V * (V + 1) + x % V] = f.ws.delta[at];
  }
  for (int x = tid; x < l * C; x += nthreads) P[x] = f.ws.P[((c.first_row + x / C) * f.HV + head) * C + x % C];
  __syncthreads();
  for (int x = tid; x < l * C; x += nthreads) {
    const int r = x / C, i = x % C;
    float acc = 0.f;
    if (i <= r) {
      for (int e = 0; e < V; ++e) acc += d_o[r * V + e] * delta[i * (V + 1) + e];
    }
    p.ws.dP[((c.first_row + r) * f.HV + head) * C + i] = f.scale * acc;
  }
  for (int x = tid; x < l * V; x += nthreads) {
    const int i = x / V, e = x % V;
    float acc = 0.f;
    for (int r = i; r < l; ++r) acc += P[r * C + i] * d_o[r * V + e];
    p.ws.d_delta[((c.first_row + i) * f.HV + head) * V + e] = acc;
  }
}

}  // namespace fkt::cuda
