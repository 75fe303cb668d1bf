// F4 on CUDA, one block per (sequence, value head, V-tile), walking the chunks in order:
// h_j = S (stored), delta = U - W S, S <- diag(exp(gamma_L)) S + K_down^T delta. S stays fp32.
#pragma once

#include "cuda/common/convert.cuh"
#include "cuda/sm90/forward/chunks.cuh"
#include "cuda/sm90/forward/state_config.hpp"

namespace fkt::cuda {

// Register blocking: lane e owns state column e; warp w owns the chunk rows w, w + 8, ... (delta)
// and the state rows w, w + 8, ... (update), so each float4 of W or K_down^T read from shared
// memory (a broadcast within the warp) feeds four multiply-adds.
__global__ void __launch_bounds__(StateConfig::kThreads, StateConfig::kMinBlocksForward) fwd_state_kernel(const __grid_constant__ ForwardParams p) {
  constexpr int kTile = StateConfig::kTileV, kGroups = StateConfig::kGroups, kMax = StateConfig::kMaxPerThread;
  const int64_t n = blockIdx.x;
  const int head = blockIdx.y, e0 = blockIdx.z * kTile;
  const int C = p.chunk, K = p.K, V = p.V, Kp = StateConfig::padded(K), width = min(kTile, V - e0);
  const SequenceSpan seq = sequence_span(p, n);
  extern __shared__ __align__(16) float smem[];
  float* S = smem;                 // [Kp, kTile]
  float* W = S + Kp * kTile;       // [C, Kp]
  float* kdT = W + C * Kp;         // [Kp, C]: K_down transposed
  float* delta = kdT + Kp * C;     // [C, kTile]
  float* g_last = delta + C * kTile;  // [Kp]
  const int tid = threadIdx.x, nthreads = blockDim.x, e = tid % 32, group = tid / 32;
  const bool column = e < width;

  for (int x = tid; x < Kp * kTile; x += nthreads) {
    const int d = x / kTile, c = x % kTile;
    S[x] = p.initial_state != nullptr && d < K && c < width ? p.initial_state[state_index(p, n, head, d, e0 + c)] : 0.f;
  }
  const int64_t chunks = (seq.length + C - 1) / C;
  for (int64_t j = 0; j < chunks; ++j) {
    const int64_t first = seq.first_row + j * C;
    const int l = static_cast<int>(min(static_cast<int64_t>(C), seq.length - j * C));
    __syncthreads();  // S of the previous chunk is complete; W, kdT, delta are free
    const int64_t chunk_row = seq.first_chunk + j;
    for (int x = tid; x < K * width; x += nthreads) {
      const int d = x / width, c = x % width;
      const float s = S[d * kTile + c];
      p.ws.states[((chunk_row * p.HV + head) * K + d) * V + e0 + c] = s;
      if (p.intermediate_states != nullptr) {  // [B, NT, HV, ...]: (b, j) flattens to chunk_row
        const int64_t base = (chunk_row * p.HV + head) * static_cast<int64_t>(K) * V;
        const int64_t at = p.state_v_first ? static_cast<int64_t>(e0 + c) * K + d : static_cast<int64_t>(d) * V + e0 + c;
        store_float(p.intermediate_states, p.o_dtype, base + at, s);
      }
    }
    // Rows past the chunk's end and columns past K are zero, so padded terms add nothing.
    for (int x = tid; x < C * Kp; x += nthreads) {
      const int r = x / Kp, d = x % Kp;
      const bool in = r < l && d < K;
      const int64_t at = ((first + r) * p.HV + head) * K + d;
      W[x] = in ? p.ws.W[at] : 0.f;
      kdT[d * C + r] = in ? p.ws.k_down[at] : 0.f;
    }
    for (int d = tid; d < Kp; d += nthreads) g_last[d] = d < K ? expf(p.ws.gamma[((first + l - 1) * p.HV + head) * K + d]) : 0.f;
    __syncthreads();

    float acc[kMax];
#pragma unroll
    for (int i = 0; i < kMax; ++i) {
      const int r = group + kGroups * i;
      acc[i] = r < l && column ? p.ws.U[((first + r) * p.HV + head) * V + e0 + e] : 0.f;
    }
    for (int d = 0; d < Kp; d += 4) {
      const float s0 = S[d * kTile + e], s1 = S[(d + 1) * kTile + e], s2 = S[(d + 2) * kTile + e],
                  s3 = S[(d + 3) * kTile + e];
#pragma unroll
      for (int i = 0; i < kMax; ++i) {
        const int r = group + kGroups * i;
        if (r < C) {
          const float4 w = *reinterpret_cast<const float4*>(W + r * Kp + d);
          acc[i] -= w.x * s0 + w.y * s1 + w.z * s2 + w.w * s3;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kMax; ++i) {
      const int r = group + kGroups * i;
      if (r < C) {
        delta[r * kTile + e] = r < l ? acc[i] : 0.f;
        if (r < l && column) p.ws.delta[((first + r) * p.HV + head) * V + e0 + e] = acc[i];
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kMax; ++i) {
      const int d = group + kGroups * i;
      acc[i] = d < Kp ? g_last[d] * S[d * kTile + e] : 0.f;
    }
    for (int r = 0; r < C; r += 4) {
      const float t0 = delta[r * kTile + e], t1 = delta[(r + 1) * kTile + e], t2 = delta[(r + 2) * kTile + e],
                  t3 = delta[(r + 3) * kTile + e];
#pragma unroll
      for (int i = 0; i < kMax; ++i) {
        const int d = group + kGroups * i;
        if (d < Kp) {
          const float4 k4 = *reinterpret_cast<const float4*>(kdT + d * C + r);
          acc[i] += k4.x * t0 + k4.y * t1 + k4.z * t2 + k4.w * t3;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kMax; ++i) {
      const int d = group + kGroups * i;
      if (d < Kp) S[d * kTile + e] = acc[i];  // every reader of S waited at the barrier above
    }
  }
  __syncthreads();
  if (p.final_state != nullptr) {
    for (int x = tid; x < K * width; x += nthreads) {
      const int d = x / width, c = x % width;
      p.final_state[state_index(p, n, head, d, e0 + c)] = S[d * kTile + c];
    }
  }
}

}  // namespace fkt::cuda
