// B6, B7 and the beta half of B8 on CUDA, one block per (chunk, value head) (kda-math.md sections
// 4.6 to 4.8): da = the reverse chunk-local cumsum of dgamma, chained through the gate activation
// into dg and the per-chunk partials of dA_log and ddt_bias; dbeta chained through the beta
// activation. The twin of src/cpu/bwd_gate_cumsum.cpp and src/cpu/bwd_gate.cpp (dv is B3's).
#pragma once

#include "cuda/common/activation.cuh"
#include "cuda/common/convert.cuh"
#include "cuda/sm90/backward/params.hpp"
#include "cuda/sm90/forward/chunks.cuh"

namespace fkt::cuda {

struct BwdGateConfig {
  static constexpr int kThreads = 128;  // one thread per column d (K <= 128 in one pass)
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kRowsInFlight = 8;
  // Eight resident blocks (64 registers a thread): the row batches wait on memory, and more blocks
  // keep more of them in flight (five blocks 0.70 ms at B1_T8192_H96, ten 0.50). Eight leave room
  // for the next batch's loads in flight during a batch's sums (0.46 -> 0.44 ms against ten without
  // them, though ptxas spills 40 bytes).
  static constexpr int kMinBlocks = 8;
  static size_t smem_bytes(int, int, int) { return 0; }
};

// GT: the element type of g and dg (bf16, fp16 or fp32: with_gate_element), and kMode the gate
// mode (with_gate_mode), known at compile time so that the loop below carries no per-element dtype
// or mode branches (the kernel was issue-bound: 63% of the issue slots busy, DRAM 40%, at
// B1_T8192_H96).
template <typename GT, GateMode kMode>
__global__ void __launch_bounds__(BwdGateConfig::kThreads, BwdGateConfig::kMinBlocks)
    bwd_gate_kernel(const __grid_constant__ BackwardParams p) {
  constexpr int kBatch = BwdGateConfig::kRowsInFlight;
  const ForwardParams& f = p.fwd;
  const int64_t chunk = blockIdx.x;
  const ChunkSpan c = chunk_span(f, chunk);
  const int head = blockIdx.y, K = f.K, l = static_cast<int>(c.rows);
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const GateInputs& gate = f.gate;
  constexpr bool kInKernel = kMode != GateMode::kPrecomputed;
  const GT* g_in = static_cast<const GT*>(gate.g);
  GT* dg = static_cast<GT*>(p.dg);
  const float rate = gate.A_log ? expf(load_float(gate.A_log, gate.A_log_dtype, head)) : 1.f;

  // Rows of dgamma (the workspace's heads) and of g and dg (io_HV heads as given). Not asked into
  // L2 ahead: with the next batch's loads in flight that cost more than it saved (0.43 -> 0.40 ms
  // without at B1_T8192_H96 on an H100, docs/design.md).
  const int64_t first = (c.first_row * f.HV + head) * K, stride = static_cast<int64_t>(f.HV) * K;
  const int64_t io_first = (c.io_row * f.io_HV + head) * K, io_stride = static_cast<int64_t>(f.io_HV) * K;

  double dA_log = 0.0;  // this thread's share of the chunk's dA_log partial
  for (int d = tid; d < K; d += nthreads) {
    const float bias = gate.dt_bias ? load_float(gate.dt_bias, gate.dt_bias_dtype, head * K + d) : 0.f;
    float da = 0.f;
    double ddt_bias = 0.0;
    // Rows from the last: da of row r is da of row r + 1 plus dgamma_r, the CPU's sum bit for bit.
    // A batch's loads are issued before its serial sums, which would otherwise wait on each load,
    // and the next batch's before this one's sums and stores, so that they wait behind them.
    auto load_batch = [&](int r0, float(&dgamma)[kBatch], float(&g)[kBatch]) {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        dgamma[u] = r0 - u >= 0 ? p.ws.dgamma[first + (r0 - u) * stride + d] : 0.f;
        g[u] = r0 - u >= 0 && kInKernel ? to_float(g_in[io_first + (r0 - u) * io_stride + d]) : 0.f;
      }
    };
    float dgamma[kBatch], g[kBatch], next_dgamma[kBatch], next_g[kBatch];
    load_batch(l - 1, dgamma, g);
    for (int r0 = l - 1; r0 >= 0; r0 -= kBatch) {
      if (r0 - kBatch >= 0) load_batch(r0 - kBatch, next_dgamma, next_g);
      // A batch's terms of the parameter gradients summed in fp32, then added in fp64: one
      // conversion each a batch (they run on the SM's narrow conversion pipe).
      float dA_log_batch = 0.f, ddt_bias_batch = 0.f;
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (r0 - u < 0) break;
        da += dgamma[u];
        float dx = da;
        if constexpr (kInKernel) {
          const float x = g[u] + bias;
          if constexpr (kMode == GateMode::kSoftplus) {
            dx = -da * rate * (x > 20.f ? 1.f : sigmoid_fast(x));
            dA_log_batch += da * (-rate * softplus_fast(x));  // da * a
          } else {
            const float sig = sigmoid_fast(rate * x);
            dx = da * gate.lower_bound * sig * (1.f - sig) * rate;
            dA_log_batch += dx * x;
          }
          ddt_bias_batch += dx;
        }
        if (dg) dg[io_first + (r0 - u) * io_stride + d] = from_float<GT>(dx);
      }
      if constexpr (kInKernel) {
        dA_log += static_cast<double>(dA_log_batch);
        ddt_bias += static_cast<double>(ddt_bias_batch);
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        dgamma[u] = next_dgamma[u];
        g[u] = next_g[u];
      }
    }
    if constexpr (kInKernel) p.ws.ddt_bias_parts[(chunk * f.HV + head) * K + d] = ddt_bias;
  }

  // dA_log partial of the chunk: a butterfly in each warp, then the warps in order (reproducible).
  if constexpr (kInKernel) {
    __shared__ double warp_sums[BwdGateConfig::kWarps];
    for (int offset = 16; offset > 0; offset /= 2) dA_log += __shfl_xor_sync(0xffffffffu, dA_log, offset);
    if (tid % 32 == 0) warp_sums[tid / 32] = dA_log;
    __syncthreads();
    if (tid == 0) {
      double sum = 0.0;
      for (int w = 0; w < BwdGateConfig::kWarps; ++w) sum += warp_sums[w];
      p.ws.dA_log_parts[chunk * f.HV + head] = sum;
    }
  }

  if (p.dbeta) {
    for (int r = tid; r < l; r += nthreads) {
      const int64_t io_at = (c.io_row + r) * f.io_HV + head;
      float grad = p.ws.dbeta[(c.first_row + r) * f.HV + head];
      if (f.beta_mode != BetaMode::kPlain) {
        const float sig = sigmoid(load_float(f.beta, f.beta_dtype, io_at));
        grad *= (f.beta_mode == BetaMode::kTwoSigmoid ? 2.f : 1.f) * sig * (1.f - sig);
      }
      store_float(p.dbeta, p.dbeta_dtype, io_at, grad);
    }
  }
}

}  // namespace fkt::cuda
