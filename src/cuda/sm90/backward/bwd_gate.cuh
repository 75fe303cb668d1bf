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

// kCols adjacent columns a thread, loaded and stored as one access each: two where K and the rows'
// alignment allow it (gate_pairs), half the load and store instructions of one (the kernel is
// issue-bound; 0.39 -> 0.30 ms at B1_T8192_H96 on an H100, docs/design.md).
template <int kCols>
struct BwdGateConfig {
  static constexpr int kThreads = 128 / kCols;  // K <= 128 in one pass
  static constexpr int kRowsInFlight = 8 / kCols;  // the same elements in flight a thread
  // 1,024 resident threads (64 registers a thread): the row batches wait on memory, and more blocks
  // keep more of them in flight (five blocks of 128 threads 0.70 ms at B1_T8192_H96, ten 0.50).
  // Eight of 128 leave room for the next batch's loads in flight during a batch's sums (0.46 ->
  // 0.44 ms against ten without them, though ptxas spills 40 bytes).
  static constexpr int kMinBlocks = 8 * kCols;
  static size_t smem_bytes(int, int, int) { return 0; }
};

// kCols adjacent elements of a row, moved as one access: the first of them aligned to the run.
template <typename T, int kCols>
struct alignas(kCols * sizeof(T)) Run {
  T e[kCols];
};

// GT: the element type of g and dg (bf16, fp16 or fp32: with_gate_element), and kMode the gate
// mode (with_gate_mode), known at compile time so that the loop below carries no per-element dtype
// or mode branches (the kernel was issue-bound: 63% of the issue slots busy, DRAM 40%, at
// B1_T8192_H96). da and dg do not depend on kCols; the parameter gradients' partials do, in their
// last bits: their fp32 sums span kRowsInFlight rows, and the dA_log butterfly's order follows
// the lanes' columns.
template <typename GT, GateMode kMode, int kCols>
__global__ void __launch_bounds__(BwdGateConfig<kCols>::kThreads, BwdGateConfig<kCols>::kMinBlocks)
    bwd_gate_kernel(const __grid_constant__ BackwardParams p) {
  constexpr int kBatch = BwdGateConfig<kCols>::kRowsInFlight;
  using Gammas = Run<float, kCols>;
  using Gates = Run<GT, kCols>;
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

  double dA_log[kCols] = {};  // this thread's shares of the chunk's dA_log partial, a column each
  for (int d = tid * kCols; d < K; d += nthreads * kCols) {
    float bias[kCols], da[kCols];
    double ddt_bias[kCols];
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      bias[j] = gate.dt_bias ? load_float(gate.dt_bias, gate.dt_bias_dtype, head * K + d + j) : 0.f;
      da[j] = 0.f;
      ddt_bias[j] = 0.0;
    }
    // Rows from the last: da of row r is da of row r + 1 plus dgamma_r, the CPU's sum bit for bit.
    // A batch's loads are issued before its serial sums, which would otherwise wait on each load,
    // and the next batch's before this one's sums and stores, so that they wait behind them.
    auto load_batch = [&](int r0, Gammas(&dgamma)[kBatch], Gates(&g)[kBatch]) {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const bool row = r0 - u >= 0;
        dgamma[u] = row ? *reinterpret_cast<const Gammas*>(p.ws.dgamma + first + (r0 - u) * stride + d) : Gammas{};
        g[u] = row && kInKernel ? *reinterpret_cast<const Gates*>(g_in + io_first + (r0 - u) * io_stride + d) : Gates{};
      }
    };
    Gammas dgamma[kBatch], next_dgamma[kBatch];
    Gates g[kBatch], next_g[kBatch];
    load_batch(l - 1, dgamma, g);
    for (int r0 = l - 1; r0 >= 0; r0 -= kBatch) {
      if (r0 - kBatch >= 0) load_batch(r0 - kBatch, next_dgamma, next_g);
      // A batch's terms of the parameter gradients summed in fp32, then added in fp64: one
      // conversion each a batch (they run on the SM's narrow conversion pipe).
      float dA_log_batch[kCols] = {}, ddt_bias_batch[kCols] = {};
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (r0 - u < 0) break;
        Gates out;
#pragma unroll
        for (int j = 0; j < kCols; ++j) {
          da[j] += dgamma[u].e[j];
          float dx = da[j];
          if constexpr (kInKernel) {
            const float x = to_float(g[u].e[j]) + bias[j];
            if constexpr (kMode == GateMode::kSoftplus) {
              dx = -da[j] * rate * (x > 20.f ? 1.f : sigmoid_fast(x));
              dA_log_batch[j] += da[j] * (-rate * softplus_fast(x));  // da * a
            } else {
              const float sig = sigmoid_fast(rate * x);
              dx = da[j] * gate.lower_bound * sig * (1.f - sig) * rate;
              dA_log_batch[j] += dx * x;
            }
            ddt_bias_batch[j] += dx;
          }
          out.e[j] = from_float<GT>(dx);
        }
        if (dg) *reinterpret_cast<Gates*>(dg + io_first + (r0 - u) * io_stride + d) = out;
      }
      if constexpr (kInKernel) {
#pragma unroll
        for (int j = 0; j < kCols; ++j) {
          dA_log[j] += static_cast<double>(dA_log_batch[j]);
          ddt_bias[j] += static_cast<double>(ddt_bias_batch[j]);
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        dgamma[u] = next_dgamma[u];
        g[u] = next_g[u];
      }
    }
    if constexpr (kInKernel) {
#pragma unroll
      for (int j = 0; j < kCols; ++j) p.ws.ddt_bias_parts[(chunk * f.HV + head) * K + d + j] = ddt_bias[j];
    }
  }

  // dA_log partial of the chunk: a butterfly over the kLanes lanes that hold 32 consecutive
  // columns, a thread's own columns added after it, then those sums in order (reproducible).
  if constexpr (kInKernel) {
    constexpr int kLanes = 32 / kCols, kSums = BwdGateConfig<kCols>::kThreads / kLanes;
    __shared__ double column_sums[kSums];
    double sum = 0.0;
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      for (int offset = kLanes / 2; offset > 0; offset /= 2) dA_log[j] += __shfl_xor_sync(0xffffffffu, dA_log[j], offset);
      sum = j == 0 ? dA_log[j] : sum + dA_log[j];
    }
    if (tid % kLanes == 0) column_sums[tid / kLanes] = sum;
    __syncthreads();
    if (tid == 0) {
      double total = 0.0;
      for (int w = 0; w < kSums; ++w) total += column_sums[w];
      p.ws.dA_log_parts[chunk * f.HV + head] = total;
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
