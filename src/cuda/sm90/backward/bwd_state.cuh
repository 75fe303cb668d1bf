// B2 on CUDA, one block per (sequence, value head, V-tile), walking the chunks in reverse.
// dS is the gradient of the state leaving the chunk: it is stored, d_delta += K_down dS, and
// dS <- diag(exp(gamma_L)) dS + s Q_up^T dO - W^T d_delta. dS stays fp32.
#pragma once

#include "cuda/common/convert.cuh"
#include "cuda/sm90/backward/params.hpp"
#include "cuda/sm90/forward/chunks.cuh"
#include "cuda/sm90/forward/state_config.hpp"

namespace fkt::cuda {

struct BwdStateConfig {
  static constexpr int kThreads = StateConfig::kThreads;
  static constexpr int kTileV = StateConfig::kTileV;
  // fp32 shared memory: dS [Kp, tile], K_down [C, Kp], Q_up^T and W^T [Kp, C], dO and d_delta
  // [C, tile], exp(gamma_L) [Kp]; Kp = K rounded up to 4, padding zero.
  static size_t smem_bytes(int C, int K, int) {
    const int Kp = StateConfig::padded(K);
    return sizeof(float) * (Kp * kTileV + 3 * C * Kp + 2 * C * kTileV + Kp);
  }
};

// The register blocking of fwd_state_kernel: lane e owns column e, warp w the chunk rows
// (d_delta) or state rows (dS) w, w + 8, ...
__global__ void __launch_bounds__(BwdStateConfig::kThreads) bwd_state_kernel(const __grid_constant__ BackwardParams p) {
  constexpr int kTile = StateConfig::kTileV, kGroups = StateConfig::kGroups, kMax = StateConfig::kMaxPerThread;
  const ForwardParams& f = p.fwd;
  const int64_t n = blockIdx.x;
  const int head = blockIdx.y, e0 = blockIdx.z * kTile;
  const int C = f.chunk, K = f.K, V = f.V, Kp = StateConfig::padded(K), width = min(kTile, V - e0);
  const SequenceSpan seq = sequence_span(f, n);
  extern __shared__ __align__(16) float smem[];
  float* dS = smem;                   // [Kp, kTile]
  float* kd = dS + Kp * kTile;        // [C, Kp]
  float* quT = kd + C * Kp;           // [Kp, C]: s * Q_up transposed
  float* wT = quT + Kp * C;           // [Kp, C]: W transposed
  float* d_o = wT + Kp * C;           // [C, kTile]
  float* dd = d_o + C * kTile;        // [C, kTile]
  float* decay = dd + C * kTile;      // [Kp]
  const int tid = threadIdx.x, nthreads = blockDim.x, e = tid % 32, group = tid / 32;
  const bool column = e < width;

  for (int x = tid; x < Kp * kTile; x += nthreads) {
    const int d = x / kTile, c = x % kTile;
    dS[x] = p.d_final_state != nullptr && d < K && c < width ? p.d_final_state[state_index(f, n, head, d, e0 + c)]
                                                              : 0.f;
  }
  const int64_t chunks = (seq.length + C - 1) / C;
  for (int64_t j = chunks - 1; j >= 0; --j) {
    const int64_t first = seq.first_row + j * C;
    const int l = static_cast<int>(min(static_cast<int64_t>(C), seq.length - j * C));
    const int64_t chunk_row = seq.first_chunk + j;
    __syncthreads();  // dS of the later chunk is complete; the chunk buffers are free
    for (int x = tid; x < K * width; x += nthreads) {
      const int d = x / width, c = x % width;
      p.ws.d_states[((chunk_row * f.HV + head) * K + d) * V + e0 + c] = dS[d * kTile + c];
    }
    // Rows past the chunk's end and columns past K are zero, so padded terms add nothing.
    for (int x = tid; x < C * Kp; x += nthreads) {
      const int r = x / Kp, d = x % Kp;
      const bool in = r < l && d < K;
      const int64_t at = ((first + r) * f.HV + head) * K + d;
      kd[x] = in ? f.ws.k_down[at] : 0.f;
      quT[d * C + r] = in ? f.scale * f.ws.q_up[at] : 0.f;
      wT[d * C + r] = in ? f.ws.W[at] : 0.f;
    }
    for (int x = tid; x < C * kTile; x += nthreads) {
      const int r = x / kTile, c = x % kTile;
      d_o[x] = r < l && c < width ? load_float(p.d_o, p.d_o_dtype, ((first + r) * f.HV + head) * V + e0 + c) : 0.f;
    }
    for (int d = tid; d < Kp; d += nthreads) {
      decay[d] = d < K ? expf(f.ws.gamma[((first + l - 1) * f.HV + head) * K + d]) : 0.f;
    }
    __syncthreads();

    float acc[kMax];
#pragma unroll
    for (int i = 0; i < kMax; ++i) {
      const int r = group + kGroups * i;
      acc[i] = r < l && column ? p.ws.d_delta[((first + r) * f.HV + head) * V + e0 + e] : 0.f;
    }
    for (int d = 0; d < Kp; d += 4) {
      const float s0 = dS[d * kTile + e], s1 = dS[(d + 1) * kTile + e], s2 = dS[(d + 2) * kTile + e],
                  s3 = dS[(d + 3) * kTile + e];
#pragma unroll
      for (int i = 0; i < kMax; ++i) {
        const int r = group + kGroups * i;
        if (r < C) {
          const float4 k4 = *reinterpret_cast<const float4*>(kd + r * Kp + d);
          acc[i] += k4.x * s0 + k4.y * s1 + k4.z * s2 + k4.w * s3;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kMax; ++i) {
      const int r = group + kGroups * i;
      if (r < C) {
        dd[r * kTile + e] = r < l ? acc[i] : 0.f;
        if (r < l && column) p.ws.d_delta[((first + r) * f.HV + head) * V + e0 + e] = acc[i];
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kMax; ++i) {
      const int d = group + kGroups * i;
      acc[i] = d < Kp ? decay[d] * dS[d * kTile + e] : 0.f;
    }
    for (int r = 0; r < C; r += 4) {
      const float o0 = d_o[r * kTile + e], o1 = d_o[(r + 1) * kTile + e], o2 = d_o[(r + 2) * kTile + e],
                  o3 = d_o[(r + 3) * kTile + e];
      const float t0 = dd[r * kTile + e], t1 = dd[(r + 1) * kTile + e], t2 = dd[(r + 2) * kTile + e],
                  t3 = dd[(r + 3) * kTile + e];
#pragma unroll
      for (int i = 0; i < kMax; ++i) {
        const int d = group + kGroups * i;
        if (d < Kp) {
          const float4 q4 = *reinterpret_cast<const float4*>(quT + d * C + r);
          const float4 w4 = *reinterpret_cast<const float4*>(wT + d * C + r);
          acc[i] += q4.x * o0 + q4.y * o1 + q4.z * o2 + q4.w * o3 - (w4.x * t0 + w4.y * t1 + w4.z * t2 + w4.w * t3);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kMax; ++i) {
      const int d = group + kGroups * i;
      if (d < Kp) dS[d * kTile + e] = acc[i];  // every reader of dS waited at the barrier above
    }
  }
  __syncthreads();
  if (p.dh0 != nullptr) {
    for (int x = tid; x < K * width; x += nthreads) {
      const int d = x / width, c = x % width;
      p.dh0[state_index(f, n, head, d, e0 + c)] = dS[d * kTile + c];
    }
  }
}

}  // namespace fkt::cuda
