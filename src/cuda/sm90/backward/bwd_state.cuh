// B2 on CUDA, one block per (sequence, value head, V-tile), walking the chunks in reverse.
// dS is the gradient of the state leaving the chunk: it is stored, d_delta += K_down dS, and
// dS <- diag(exp(gamma_L)) dS + s Q_up^T dO - W^T d_delta. dS stays fp32.
#pragma once

#include "cuda/common/convert.cuh"
#include "cuda/sm90/backward/params.hpp"
#include "cuda/sm90/forward/chunks.cuh"

namespace fkt::cuda {

struct BwdStateConfig {
  static constexpr int kThreads = 256;
  static constexpr int kTileV = 32;
  // fp32 shared memory: dS [K, tile], K_down, W, Q_up [C, K], dO and d_delta [C, tile], gamma_L [K].
  static size_t smem_bytes(int C, int K, int) { return sizeof(float) * (K * kTileV + 3 * C * K + 2 * C * kTileV + K); }
};

__global__ void __launch_bounds__(BwdStateConfig::kThreads) bwd_state_kernel(const __grid_constant__ BackwardParams p) {
  constexpr int kTile = BwdStateConfig::kTileV;
  const ForwardParams& f = p.fwd;
  const int64_t n = blockIdx.x;
  const int head = blockIdx.y, e0 = blockIdx.z * kTile;
  const int C = f.chunk, K = f.K, V = f.V, width = min(kTile, V - e0);
  const SequenceSpan seq = sequence_span(f, n);
  extern __shared__ float smem[];
  float* dS = smem;                   // [K, kTile]
  float* kd = dS + K * kTile;         // [C, K]
  float* W = kd + C * K;              // [C, K]
  float* qu = W + C * K;              // [C, K]
  float* d_o = qu + C * K;            // [C, kTile]
  float* dd = d_o + C * kTile;        // [C, kTile]
  float* decay = dd + C * kTile;      // [K]
  const int tid = threadIdx.x, nthreads = blockDim.x;

  for (int x = tid; x < K * kTile; x += nthreads) {
    const int d = x / kTile, e = x % kTile;
    dS[x] = p.d_final_state != nullptr && e < width ? p.d_final_state[state_index(f, n, head, d, e0 + e)] : 0.f;
  }
  const int64_t chunks = (seq.length + C - 1) / C;
  for (int64_t j = chunks - 1; j >= 0; --j) {
    const int64_t first = seq.first_row + j * C;
    const int l = static_cast<int>(min(static_cast<int64_t>(C), seq.length - j * C));
    const int64_t chunk_row = seq.first_chunk + j;
    __syncthreads();  // dS of the later chunk is complete; the chunk buffers are free
    for (int x = tid; x < K * width; x += nthreads) {
      const int d = x / width, e = x % width;
      p.ws.d_states[((chunk_row * f.HV + head) * K + d) * V + e0 + e] = dS[d * kTile + e];
    }
    for (int x = tid; x < l * K; x += nthreads) {
      const int64_t at = ((first + x / K) * f.HV + head) * K + x % K;
      kd[x] = f.ws.k_down[at];
      W[x] = f.ws.W[at];
      qu[x] = f.ws.q_up[at];
    }
    for (int x = tid; x < l * width; x += nthreads) {
      const int r = x / width, e = x % width;
      d_o[r * kTile + e] = load_float(p.d_o, p.d_o_dtype, ((first + r) * f.HV + head) * V + e0 + e);
    }
    for (int d = tid; d < K; d += nthreads) decay[d] = expf(f.ws.gamma[((first + l - 1) * f.HV + head) * K + d]);
    __syncthreads();
    for (int x = tid; x < l * width; x += nthreads) {
      const int r = x / width, e = x % width;
      const int64_t at = ((first + r) * f.HV + head) * V + e0 + e;
      float acc = p.ws.d_delta[at];
      for (int d = 0; d < K; ++d) acc += kd[r * K + d] * dS[d * kTile + e];
      dd[r * kTile + e] = acc;
      p.ws.d_delta[at] = acc;
    }
    __syncthreads();
    for (int x = tid; x < K * width; x += nthreads) {
      const int d = x / width, e = x % width;
      float s = decay[d] * dS[d * kTile + e];
      for (int r = 0; r < l; ++r) s += f.scale * qu[r * K + d] * d_o[r * kTile + e] - W[r * K + d] * dd[r * kTile + e];
      dS[d * kTile + e] = s;
    }
  }
  __syncthreads();
  if (p.dh0 != nullptr) {
    for (int x = tid; x < K * width; x += nthreads) {
      const int d = x / width, e = x % width;
      p.dh0[state_index(f, n, head, d, e0 + e)] = dS[d * kTile + e];
    }
  }
}

}  // namespace fkt::cuda
