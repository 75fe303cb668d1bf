// F5 on CUDA, one block per (chunk, value head, V-tile): O = s Q_up h + tril(P) delta, stored in
// q's dtype.
#pragma once

#include "cuda/common/convert.cuh"
#include "cuda/sm90/forward/chunks.cuh"

namespace fkt::cuda {

struct OutputConfig {
  static constexpr int kThreads = 256;
  static constexpr int kTileV = 64;
  // fp32 shared memory: Q_up [C, K], h [K, tile], P [C, C], delta [C, tile].
  static size_t smem_bytes(int C, int K) { return sizeof(float) * (C * K + K * kTileV + C * C + C * kTileV); }
};

__global__ void __launch_bounds__(OutputConfig::kThreads) fwd_output_kernel(const __grid_constant__ ForwardParams p) {
  constexpr int kTile = OutputConfig::kTileV;
  const int64_t chunk = blockIdx.x;
  const ChunkSpan c = chunk_span(p, chunk);
  const int head = blockIdx.y, e0 = blockIdx.z * kTile;
  const int C = p.chunk, K = p.K, V = p.V, l = static_cast<int>(c.rows), width = min(kTile, V - e0);
  extern __shared__ float smem[];
  float* qu = smem;               // [C, K]
  float* h = qu + C * K;          // [K, kTile]
  float* P = h + K * kTile;       // [C, C]
  float* delta = P + C * C;       // [C, kTile]
  const int tid = threadIdx.x, nthreads = blockDim.x;

  for (int x = tid; x < l * K; x += nthreads) qu[x] = p.ws.q_up[((c.first_row + x / K) * p.HV + head) * K + x % K];
  for (int x = tid; x < K * width; x += nthreads) {
    const int d = x / width, e = x % width;
    h[d * kTile + e] = p.ws.states[((chunk * p.HV + head) * K + d) * V + e0 + e];
  }
  for (int x = tid; x < l * C; x += nthreads) P[x] = p.ws.P[((c.first_row + x / C) * p.HV + head) * C + x % C];
  for (int x = tid; x < l * width; x += nthreads) {
    const int r = x / width, e = x % width;
    delta[r * kTile + e] = p.ws.delta[((c.first_row + r) * p.HV + head) * V + e0 + e];
  }
  __syncthreads();
  for (int x = tid; x < l * width; x += nthreads) {
    const int r = x / width, e = x % width;
    float inter = 0.f, intra = 0.f;
    for (int d = 0; d < K; ++d) inter += qu[r * K + d] * h[d * kTile + e];
    for (int i = 0; i <= r; ++i) intra += P[r * C + i] * delta[i * kTile + e];
    store_float(p.o, p.o_dtype, ((c.first_row + r) * p.HV + head) * V + e0 + e, p.scale * inter + intra);
  }
}

}  // namespace fkt::cuda
