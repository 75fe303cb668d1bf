// B4 on CUDA, one block per (chunk, value head): the gradients through P = s M_qk and
// A = diag(beta) M_kk (kda-math.md section 4.4), added in place to B3's dq, dk, dgamma and dbeta.
// Rows sum over their columns (dq_rows, dk_rows), columns over their rows (dk_cols); dgamma gets +
// on the row side and - on the column side of every exp(gamma_r - gamma_i). fp32 on CUDA cores,
// the twin of src/cpu/bwd_intra.cpp term by term.
#pragma once

#include "cuda/sm90/backward/params.hpp"
#include "cuda/sm90/forward/chunks.cuh"

namespace fkt::cuda {

struct BwdIntraConfig {
  static constexpr int kThreads = 256;
  static constexpr int kWarps = kThreads / 32;
  // fp32 shared memory: q_hat, k_hat, gamma and the dbeta terms [C, K], dP and dA [C, C], beta [C]
  // (164 KB for C = 64, K = 128).
  static size_t smem_bytes(int C, int K, int) { return sizeof(float) * (4 * C * K + 2 * C * C + C); }
};

__global__ void __launch_bounds__(BwdIntraConfig::kThreads) bwd_intra_kernel(const __grid_constant__ BackwardParams p) {
  const ForwardParams& f = p.fwd;
  const ChunkSpan c = chunk_span(f, blockIdx.x);
  const int head = blockIdx.y, C = f.chunk, K = f.K, l = static_cast<int>(c.rows);
  extern __shared__ float smem[];
  float* q = smem;           // [C, K]
  float* k = q + C * K;      // [C, K]
  float* g = k + C * K;      // [C, K]
  float* kdk = g + C * K;    // [C, K] k * dk_rows before the beta scaling: the dbeta terms
  float* dP = kdk + C * K;   // [C, C] only i <= r is loaded and read
  float* dA = dP + C * C;    // [C, C] likewise, with a zero diagonal
  float* beta = dA + C * C;  // [C]
  const int tid = threadIdx.x, nthreads = blockDim.x;

  for (int x = tid; x < l * K; x += nthreads) {
    const int64_t at = ((c.first_row + x / K) * f.HV + head) * K + x % K;
    q[x] = f.ws.q_hat[at];
    k[x] = f.ws.k_hat[at];
    g[x] = f.ws.gamma[at];
  }
  // dP is valid for i <= r and dA for i < r; A has no diagonal, so dA's is stored as 0 and both
  // triangles share the loop bounds below (the CPU adds the same zero terms).
  for (int x = tid; x < l * C; x += nthreads) {
    const int r = x / C, i = x % C;
    if (i > r) continue;
    const int64_t at = ((c.first_row + r) * f.HV + head) * C + i;
    dP[x] = p.ws.dP[at];
    dA[x] = i < r ? p.ws.dA[at] : 0.f;
  }
  for (int r = tid; r < l; r += nthreads) beta[r] = f.ws.beta_act[(c.first_row + r) * f.HV + head];
  __syncthreads();

  // Element (r, d) takes the row side of row r and the column side of column r: l + 1 terms for
  // every element, so the work is balanced. Every exponent is gamma_later - gamma_earlier (<= 0
  // for non-positive gates, the same differences as the forward's). The elements of one chunk
  // and head belong to this block alone, so B3's partials are updated without atomics.
  for (int x = tid; x < l * K; x += nthreads) {
    const int r = x / K, d = x % K;
    const float g_r = g[x];
    float dq_rows = 0.f, dk_rows = 0.f;
    for (int i = 0; i <= r; ++i) {
      const float k_i = k[i * K + d], decay = expf(g_r - g[i * K + d]);
      dq_rows += dP[r * C + i] * k_i * decay;
      dk_rows += dA[r * C + i] * k_i * decay;
    }
    float dk_cols = 0.f;
    for (int j = r; j < l; ++j) {
      const float decay = expf(g[j * K + d] - g_r);
      dk_cols += (dP[j * C + r] * q[j * K + d] + dA[j * C + r] * beta[j] * k[j * K + d]) * decay;
    }
    kdk[x] = k[x] * dk_rows;
    dk_rows *= beta[r];
    const int64_t at = ((c.first_row + r) * f.HV + head) * K + d;
    p.ws.dq[at] += dq_rows;
    p.ws.dk[at] += dk_rows + dk_cols;
    p.ws.dgamma[at] += q[x] * dq_rows + k[x] * (dk_rows - dk_cols);
  }
  __syncthreads();

  // dbeta_r += sum_d k_r,d dk_rows_r,d: one warp per row, lanes over d, then a butterfly, so the
  // order of the sum depends on K only (bitwise reproducible).
  const int warp = tid / 32, lane = tid % 32;
  for (int r = warp; r < l; r += BwdIntraConfig::kWarps) {
    float sum = 0.f;
    for (int d = lane; d < K; d += 32) sum += kdk[r * K + d];
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) p.ws.dbeta[(c.first_row + r) * f.HV + head] += sum;
  }
}

}  // namespace fkt::cuda
