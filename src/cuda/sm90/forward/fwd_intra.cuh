// F2 and F3 on CUDA, one block per (chunk, value head): P and A of the chunk, T = (I + A)^-1 by
// forward substitution, then W = T diag(beta) K_up, U = T diag(beta) V, K_down and Q_up.
// fp32 on CUDA cores: the correctness-first version whose tensor-core successor keeps its contract.
#pragma once

#include "cuda/common/convert.cuh"
#include "cuda/sm90/forward/chunks.cuh"

namespace fkt::cuda {

struct IntraConfig {
  static constexpr int kThreads = 256;
  static constexpr int kWarps = kThreads / 32;
  // fp32 shared memory: q, k, gamma [C, K + 1], v [C, V], beta [C], A and T [C, C + 1]. The odd
  // row strides keep column walks (fixed d, varying row) free of bank conflicts.
  static size_t smem_bytes(int C, int K, int V) {
    return sizeof(float) * (3 * C * (K + 1) + C * V + C + 2 * C * (C + 1));
  }
};

__device__ __forceinline__ float activate_beta(BetaMode mode, float b) {
  if (mode == BetaMode::kPlain) return b;
  const float s = 1.f / (1.f + expf(-b));
  return mode == BetaMode::kSigmoid ? s : 2.f * s;
}

// Scales each of `rows` rows of x [rows, K] (row stride ld) by 1 / sqrt(sum of squares + 1e-6)
// (kda-math.md 2.3).
__device__ __forceinline__ void l2norm_rows(float* x, int rows, int K, int ld) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < rows; r += IntraConfig::kWarps) {
    float sum = 0.f;
    for (int d = lane; d < K; d += 32) sum += x[r * ld + d] * x[r * ld + d];
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    const float rstd = 1.f / sqrtf(sum + 1e-6f);  // as bwd_prepare and the CPU evaluate it
    for (int d = lane; d < K; d += 32) x[r * ld + d] *= rstd;
  }
}

__global__ void __launch_bounds__(IntraConfig::kThreads) fwd_intra_kernel(const __grid_constant__ ForwardParams p) {
  const ChunkSpan c = chunk_span(p, blockIdx.x);
  const int head = blockIdx.y, qk_head = head / (p.HV / p.H);
  const int C = p.chunk, K = p.K, V = p.V, l = static_cast<int>(c.rows), ld = K + 1;
  extern __shared__ float smem[];
  float* q = smem;                // [C, ld]; later beta * k * exp(gamma)
  float* k = q + C * ld;          // [C, ld]
  float* g = k + C * ld;          // [C, ld]
  float* v = g + C * ld;          // [C, V]; later beta * v
  float* beta = v + C * V;        // [C]
  float* A = beta + C;            // [C, C + 1]
  float* T = A + C * (C + 1);     // [C, C + 1]
  const int tid = threadIdx.x, nthreads = blockDim.x;

  for (int x = tid; x < l * K; x += nthreads) {
    const int r = x / K, d = x % K;
    const int64_t row = c.first_row + r;
    q[r * ld + d] = load_float(p.q, p.qk_dtype, (row * p.H + qk_head) * K + d);
    k[r * ld + d] = load_float(p.k, p.qk_dtype, (row * p.H + qk_head) * K + d);
    g[r * ld + d] = p.ws.gamma[(row * p.HV + head) * K + d];
  }
  for (int x = tid; x < l * V; x += nthreads) {
    const int64_t row = c.first_row + x / V;
    v[x] = load_float(p.v, p.v_dtype, (row * p.HV + head) * V + x % V);
  }
  for (int r = tid; r < l; r += nthreads) {
    beta[r] = activate_beta(p.beta_mode, load_float(p.beta, p.beta_dtype, (c.first_row + r) * p.HV + head));
  }
  __syncthreads();
  if (p.l2norm) {
    l2norm_rows(q, l, K, ld);
    l2norm_rows(k, l, K, ld);
    __syncthreads();
  }

  if (p.ws.q_hat != nullptr) {  // the backward's recompute keeps what its stages read again
    for (int x = tid; x < l * K; x += nthreads) {
      const int r = x / K, d = x % K;
      const int64_t out = ((c.first_row + r) * p.HV + head) * K + d;
      p.ws.q_hat[out] = q[r * ld + d];
      p.ws.k_hat[out] = k[r * ld + d];
    }
    for (int r = tid; r < l; r += nthreads) p.ws.beta_act[(c.first_row + r) * p.HV + head] = beta[r];
  }

  // P[r, i] = s sum_d q_r k_i exp(g_r - g_i) for i <= r (exponent <= 0 for non-positive gates),
  // A[r, i] = beta_r sum_d k_r k_i exp(g_r - g_i) for i < r. Every column of P's rows is written.
  for (int x = tid; x < l * C; x += nthreads) {
    const int r = x / C, i = x % C;
    float qk = 0.f, kk = 0.f;
    if (i <= r) {
      for (int d = 0; d < K; ++d) {
        const float decay = expf(g[r * ld + d] - g[i * ld + d]);
        qk += q[r * ld + d] * k[i * ld + d] * decay;
        kk += k[r * ld + d] * k[i * ld + d] * decay;
      }
    }
    p.ws.P[((c.first_row + r) * p.HV + head) * C + i] = p.scale * qk;
    A[r * (C + 1) + i] = i < r ? beta[r] * kk : 0.f;
  }
  __syncthreads();
  // Row r of (I + A)^-1 is e_r - sum_{m < r} A[r, m] * row m: rows in order, columns in parallel.
  for (int r = 0; r < l; ++r) {
    for (int i = tid; i <= r; i += nthreads) {
      float t = i == r ? 1.f : 0.f;
      for (int m = i; m < r; ++m) t -= A[r * (C + 1) + m] * T[m * (C + 1) + i];
      T[r * (C + 1) + i] = t;
    }
    __syncthreads();
  }

  if (p.ws.T != nullptr) {
    for (int x = tid; x < l * C; x += nthreads) {
      const int r = x / C, i = x % C;
      p.ws.T[((c.first_row + r) * p.HV + head) * C + i] = i <= r ? T[r * (C + 1) + i] : 0.f;
    }
  }
  const float* g_last = g + (l - 1) * ld;
  for (int x = tid; x < l * K; x += nthreads) {
    const int r = x / K, d = x % K;
    const int64_t out = ((c.first_row + r) * p.HV + head) * K + d;
    const int at = r * ld + d;
    const float up = expf(g[at]);
    p.ws.q_up[out] = q[at] * up;
    p.ws.k_down[out] = k[at] * expf(g_last[d] - g[at]);
    q[at] = beta[r] * k[at] * up;
  }
  for (int x = tid; x < l * V; x += nthreads) v[x] *= beta[x / V];
  __syncthreads();
  for (int x = tid; x < l * K; x += nthreads) {
    const int r = x / K, d = x % K;
    float w = 0.f;
    for (int i = 0; i <= r; ++i) w += T[r * (C + 1) + i] * q[i * ld + d];
    p.ws.W[((c.first_row + r) * p.HV + head) * K + d] = w;
  }
  for (int x = tid; x < l * V; x += nthreads) {
    const int r = x / V, e = x % V;
    float u = 0.f;
    for (int i = 0; i <= r; ++i) u += T[r * (C + 1) + i] * v[i * V + e];
    p.ws.U[((c.first_row + r) * p.HV + head) * V + e] = u;
  }
}

}  // namespace fkt::cuda
