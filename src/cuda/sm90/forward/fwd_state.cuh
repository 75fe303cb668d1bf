// F4 on CUDA, one block per (sequence, value head, V-tile), walking the chunks in order:
// h_j = S (stored), delta = U - W S, S <- diag(exp(gamma_L)) S + K_down^T delta. S stays fp32.
#pragma once

#include "cuda/common/convert.cuh"
#include "cuda/sm90/forward/chunks.cuh"

namespace fkt::cuda {

struct StateConfig {
  static constexpr int kThreads = 256;
  static constexpr int kTileV = 32;  // state columns per block: N * HV * ceil(V / 32) blocks
  // fp32 shared memory: S [K, tile], W and K_down [C, K], delta [C, tile], gamma_L [K].
  static size_t smem_bytes(int C, int K) { return sizeof(float) * (K * kTileV + 2 * C * K + C * kTileV + K); }
};

__global__ void __launch_bounds__(StateConfig::kThreads) fwd_state_kernel(const __grid_constant__ ForwardParams p) {
  constexpr int kTile = StateConfig::kTileV;
  const int64_t n = blockIdx.x;
  const int head = blockIdx.y, e0 = blockIdx.z * kTile;
  const int C = p.chunk, K = p.K, V = p.V, width = min(kTile, V - e0);
  const SequenceSpan seq = sequence_span(p, n);
  extern __shared__ float smem[];
  float* S = smem;                // [K, kTile]
  float* W = S + K * kTile;       // [C, K]
  float* kd = W + C * K;          // [C, K]
  float* delta = kd + C * K;      // [C, kTile]
  float* g_last = delta + C * kTile;  // [K]
  const int tid = threadIdx.x, nthreads = blockDim.x;

  for (int x = tid; x < K * kTile; x += nthreads) {
    const int d = x / kTile, e = x % kTile;
    S[x] = p.initial_state != nullptr && e < width ? p.initial_state[state_index(p, n, head, d, e0 + e)] : 0.f;
  }
  const int64_t chunks = (seq.length + C - 1) / C;
  for (int64_t j = 0; j < chunks; ++j) {
    const int64_t first = seq.first_row + j * C;
    const int l = static_cast<int>(min(static_cast<int64_t>(C), seq.length - j * C));
    __syncthreads();  // S of the previous chunk is complete; W, kd, delta are free
    const int64_t chunk_row = seq.first_chunk + j;
    for (int x = tid; x < K * width; x += nthreads) {
      const int d = x / width, e = x % width;
      const float s = S[d * kTile + e];
      p.ws.states[((chunk_row * p.HV + head) * K + d) * V + e0 + e] = s;
      if (p.intermediate_states != nullptr) {  // [B, NT, HV, ...]: (b, j) flattens to chunk_row
        const int64_t base = (chunk_row * p.HV + head) * static_cast<int64_t>(K) * V;
        const int64_t at = p.state_v_first ? static_cast<int64_t>(e0 + e) * K + d : static_cast<int64_t>(d) * V + e0 + e;
        store_float(p.intermediate_states, p.o_dtype, base + at, s);
      }
    }
    for (int x = tid; x < l * K; x += nthreads) {
      const int64_t at = ((first + x / K) * p.HV + head) * K + x % K;
      W[x] = p.ws.W[at];
      kd[x] = p.ws.k_down[at];
    }
    for (int d = tid; d < K; d += nthreads) g_last[d] = expf(p.ws.gamma[((first + l - 1) * p.HV + head) * K + d]);
    __syncthreads();
    for (int x = tid; x < l * width; x += nthreads) {
      const int r = x / width, e = x % width;
      float acc = p.ws.U[((first + r) * p.HV + head) * V + e0 + e];
      for (int d = 0; d < K; ++d) acc -= W[r * K + d] * S[d * kTile + e];
      delta[r * kTile + e] = acc;
      p.ws.delta[((first + r) * p.HV + head) * V + e0 + e] = acc;
    }
    __syncthreads();
    for (int x = tid; x < K * width; x += nthreads) {
      const int d = x / width, e = x % width;
      float s = g_last[d] * S[d * kTile + e];
      for (int r = 0; r < l; ++r) s += kd[r * K + d] * delta[r * kTile + e];
      S[d * kTile + e] = s;
    }
  }
  __syncthreads();
  if (p.final_state != nullptr) {
    for (int x = tid; x < K * width; x += nthreads) {
      const int d = x / width, e = x % width;
      p.final_state[state_index(p, n, head, d, e0 + e)] = S[d * kTile + e];
    }
  }
}

}  // namespace fkt::cuda
