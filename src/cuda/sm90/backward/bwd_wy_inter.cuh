// B3 on CUDA, one block per (chunk, value head): the inter-chunk paths (Q_up S, K_down^T delta,
// W S) and the WY representation (U = T diag(beta) V, W = T diag(beta) K_up), as in
// src/cpu/bwd_wy_inter.cpp. Writes dq, dk, dgamma and dbeta partials, dv (final) and dA.
// S = h (state entering the chunk), dS = d_states (gradient of the state leaving it).
#pragma once

#include "cuda/common/convert.cuh"
#include "cuda/sm90/backward/params.hpp"
#include "cuda/sm90/forward/chunks.cuh"

namespace fkt::cuda {

struct WyInterConfig {
  static constexpr int kThreads = 256;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kTileV = 32;  // state columns per pass of phase 1
  // Row stride of the [C, width] buffers: odd, so walks down a column (varying row) are free of
  // bank conflicts.
  __host__ __device__ static int width(int C, int K, int V) { return max(max(K, V), C + 1) | 1; }
  // fp32 shared memory: three [C, width] buffers; a region for phase-1 tiles (S, dS transposed
  // [tile, K + 1]; dO, delta, d_delta [C, tile]) that later holds T [C, C + 1], d_delta [C, V] and
  // v [C, V + 1]; carry [K].
  __host__ __device__ static int region(int C, int K, int V) {
    return max(2 * (K + 1) * kTileV + 3 * C * kTileV, C * (C + 1) + C * V + C * (V + 1));
  }
  static size_t smem_bytes(int C, int K, int V) {
    return sizeof(float) * (3 * C * width(C, K, V) + region(C, K, V) + K);
  }
};

__global__ void __launch_bounds__(WyInterConfig::kThreads) bwd_wy_inter_kernel(const __grid_constant__ BackwardParams p) {
  constexpr int kTile = WyInterConfig::kTileV;
  const ForwardParams& f = p.fwd;
  const int64_t chunk = blockIdx.x;
  const ChunkSpan c = chunk_span(f, chunk);
  const int head = blockIdx.y, C = f.chunk, K = f.K, V = f.V, l = static_cast<int>(c.rows);
  const int Wd = WyInterConfig::width(C, K, V);
  extern __shared__ float smem[];
  float* B0 = smem;                     // dO S^T, then Y_w = T^T dW, then dT
  float* B1 = B0 + C * Wd;              // delta dS^T, then dk_inter, then K_up, then Z = tril(dT) T^T
  float* B2 = B1 + C * Wd;              // d_delta S^T, then dW
  float* R = B2 + C * Wd;               // phase-1 tiles, then T, d_delta and v
  float* carry = R + WyInterConfig::region(C, K, V);  // [K] sum_e S[d, e] dS[d, e]
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const int warp = tid / 32, lane = tid % 32;
  const int64_t state = (chunk * f.HV + head) * static_cast<int64_t>(K) * V;
  auto row_at = [&](int r) { return (c.first_row + r) * f.HV + head; };  // (token, value head) row

  // Phase 1: B0 = dO S^T, B1 = delta dS^T, B2 = d_delta S^T, carry = rowsum(S * dS), by V-tiles.
  for (int x = tid; x < l * K; x += nthreads) B0[x / K * Wd + x % K] = B1[x / K * Wd + x % K] = B2[x / K * Wd + x % K] = 0.f;
  for (int d = tid; d < K; d += nthreads) carry[d] = 0.f;
  const int ls = K + 1;            // row stride of the transposed state tiles
  float* S = R;                    // [kTile, ls]: S[e * ls + d] = state[d, e0 + e]
  float* dS = S + kTile * ls;      // [kTile, ls]
  float* tile_do = dS + kTile * ls; // [C, kTile]
  float* tile_delta = tile_do + C * kTile;
  float* tile_dd = tile_delta + C * kTile;
  for (int e0 = 0; e0 < V; e0 += kTile) {
    const int width = min(kTile, V - e0);
    __syncthreads();
    for (int x = tid; x < K * kTile; x += nthreads) {
      const int d = x / kTile, e = x % kTile;
      const bool in = e < width;
      S[e * ls + d] = in ? f.ws.states[state + static_cast<int64_t>(d) * V + e0 + e] : 0.f;
      dS[e * ls + d] = in ? p.ws.d_states[state + static_cast<int64_t>(d) * V + e0 + e] : 0.f;
    }
    for (int x = tid; x < C * kTile; x += nthreads) {
      const int r = x / kTile, e = x % kTile;
      const bool in = r < l && e < width;
      const int64_t at = row_at(r) * V + e0 + e;
      tile_do[x] = in ? load_float(p.d_o, p.d_o_dtype, at) : 0.f;
      tile_delta[x] = in ? f.ws.delta[at] : 0.f;
      tile_dd[x] = in ? p.ws.d_delta[at] : 0.f;
    }
    __syncthreads();
    for (int x = tid; x < l * K; x += nthreads) {
      const int r = x / K, d = x % K;
      float a0 = 0.f, a1 = 0.f, a2 = 0.f;
      for (int e = 0; e < width; ++e) {
        a0 += tile_do[r * kTile + e] * S[e * ls + d];
        a1 += tile_delta[r * kTile + e] * dS[e * ls + d];
        a2 += tile_dd[r * kTile + e] * S[e * ls + d];
      }
      B0[r * Wd + d] += a0;
      B1[r * Wd + d] += a1;
      B2[r * Wd + d] += a2;
    }
    for (int d = tid; d < K; d += nthreads) {
      float acc = 0.f;
      for (int e = 0; e < width; ++e) acc += S[e * ls + d] * dS[e * ls + d];
      carry[d] += acc;
    }
  }
  __syncthreads();

  // Phase 2: dq_inter, dk_inter, dW and the first dgamma terms; then T and d_delta into R.
  const float* gamma = f.ws.gamma;
  const int64_t last = row_at(l - 1) * K;
  for (int x = tid; x < l * K; x += nthreads) {
    const int r = x / K, d = x % K;
    const int64_t at = row_at(r) * K + d;
    const float g = gamma[at];
    const float dq = f.scale * B0[r * Wd + d] * expf(g);
    const float dk_inter = B1[r * Wd + d] * expf(gamma[last + d] - g);
    B1[r * Wd + d] = dk_inter;
    B2[r * Wd + d] = -B2[r * Wd + d];
    p.ws.dq[at] = dq;
    p.ws.dgamma[at] = f.ws.q_hat[at] * dq - f.ws.k_hat[at] * dk_inter;
  }
  float* T = R;                   // [C, C + 1]
  float* dd = T + C * (C + 1);    // [C, V]
  float* vs = dd + C * V;         // [C, V + 1]
  __syncthreads();
  for (int x = tid; x < l * C; x += nthreads) T[x / C * (C + 1) + x % C] = f.ws.T[row_at(x / C) * C + x % C];
  for (int x = tid; x < l * V; x += nthreads) {
    dd[x] = p.ws.d_delta[row_at(x / V) * V + x % V];
    vs[x / V * (V + 1) + x % V] = load_float(f.v, f.v_dtype, row_at(x / V) * V + x % V);
  }
  __syncthreads();

  // Phase 3: B0 = Y_w = T^T dW.
  for (int x = tid; x < l * K; x += nthreads) {
    const int i = x / K, d = x % K;
    float acc = 0.f;
    for (int r = i; r < l; ++r) acc += T[r * (C + 1) + i] * B2[r * Wd + d];
    B0[i * Wd + d] = acc;
  }
  __syncthreads();

  // Phase 4, one warp per row i (fixed-order reductions): Y_u = T^T d_delta, dv = beta Y_u,
  // dbeta = Y_u . v + Y_w . K_up; the last row's dgamma gets the gamma_L terms.
  for (int i = warp; i < l; i += WyInterConfig::kWarps) {
    const int64_t row = row_at(i);
    const float beta = f.ws.beta_act[row];
    float db = 0.f;
    for (int e = lane; e < V; e += 32) {
      float yu = 0.f;
      for (int r = i; r < l; ++r) yu += T[r * (C + 1) + i] * dd[r * V + e];
      if (p.dv != nullptr) store_float(p.dv, p.dv_dtype, row * V + e, beta * yu);
      db += yu * vs[i * (V + 1) + e];
    }
    for (int d = lane; d < K; d += 32) db += B0[i * Wd + d] * f.ws.k_hat[row * K + d] * expf(gamma[row * K + d]);
    for (int offset = 16; offset > 0; offset /= 2) db += __shfl_xor_sync(0xffffffffu, db, offset);
    if (lane == 0) p.ws.dbeta[row] = db;
  }
  for (int d = tid; d < K; d += nthreads) {
    float acc = expf(gamma[last + d]) * carry[d];
    for (int r = 0; r < l; ++r) acc += f.ws.k_hat[row_at(r) * K + d] * B1[r * Wd + d];
    p.ws.dgamma[last + d] += acc;
  }
  __syncthreads();
  // Phase 5: dk = dk_inter + beta exp(gamma) Y_w, dgamma += beta K_up Y_w; then B1 = K_up.
  for (int x = tid; x < l * K; x += nthreads) {
    const int r = x / K, d = x % K;
    const int64_t at = row_at(r) * K + d;
    const float up = expf(gamma[at]), beta = f.ws.beta_act[row_at(r)], yw = B0[r * Wd + d];
    p.ws.dk[at] = B1[r * Wd + d] + beta * up * yw;
    p.ws.dgamma[at] += beta * f.ws.k_hat[at] * up * yw;
  }
  __syncthreads();
  for (int x = tid; x < l * K; x += nthreads) {
    const int64_t at = row_at(x / K) * K + x % K;
    B1[x / K * Wd + x % K] = f.ws.k_hat[at] * expf(gamma[at]);
  }
  __syncthreads();
  // Phase 6: B0 = dT[r, i] = beta_i (d_delta_r . v_i + dW_r . K_up_i) for i < r.
  for (int x = tid; x < l * C; x += nthreads) {
    const int r = x / C, i = x % C;
    float acc = 0.f;
    if (i < r) {
      for (int e = 0; e < V; ++e) acc += dd[r * V + e] * vs[i * (V + 1) + e];
      for (int d = 0; d < K; ++d) acc += B2[r * Wd + d] * B1[i * Wd + d];
      acc *= f.ws.beta_act[row_at(i)];
    }
    B0[r * Wd + i] = acc;
  }
  __syncthreads();
  // Phase 7: B1 = Z = tril(dT) T^T, Z[m, i] = sum_{n < m, n <= i} dT[m, n] T[i, n].
  for (int x = tid; x < l * C; x += nthreads) {
    const int m = x / C, i = x % C;
    float acc = 0.f;
    for (int n = 0; n < m && n <= i && i < l; ++n) acc += B0[m * Wd + n] * T[i * (C + 1) + n];
    B1[m * Wd + i] = acc;
  }
  __syncthreads();
  // Phase 8: dA[r, i] = -sum_{m >= r} T[m, r] Z[m, i] for i < r (every column written).
  for (int x = tid; x < l * C; x += nthreads) {
    const int r = x / C, i = x % C;
    float acc = 0.f;
    if (i < r) {
      for (int m = r; m < l; ++m) acc += T[m * (C + 1) + r] * B1[m * Wd + i];
    }
    p.ws.dA[row_at(r) * C + i] = -acc;
  }
}

}  // namespace fkt::cuda
