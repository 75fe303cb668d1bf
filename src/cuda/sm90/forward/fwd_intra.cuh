// F1 to F3 on CUDA, one block per (chunk, value head): gamma of the chunk (F1 in shared memory,
// written out for the backward only), P and A, T = (I + A)^-1, then W = T diag(beta) K_up,
// U = T diag(beta) V, K_down and Q_up. The chunk is cut into 16-row sub-chunks (one tensor-core row
// tile): the 16 x 16 blocks of P and A use the reference-row factorisation of kda-math.md 3.4 on
// tensor cores, T is inverted block by block, and U, W are tensor-core products (common/mma.cuh).
// At the common shape with 16-bit inputs (kFactors) the six blocks below the diagonal come from fp16
// factors formed once a chunk (forward/intra_factors.cuh).
// kRecompute (the backward's B0 after a forward that saved T and P: ForwardWorkspace::recompute)
// reads T as the forward stored it and forms neither P, A nor the inverse: the same W and U bits.
// kFromT (ForwardWorkspace::values_from_t, at the common shape with bf16 products) stores T
// and K_up in W's place and forms neither W nor U: F4 forms the new values from T.
#pragma once

#include "cuda/common/convert.cuh"
#include "cuda/common/fast_exp.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/mma_pairs.cuh"
#include "cuda/common/round_up.hpp"
#include "cuda/common/tile_copy.cuh"
#include "cuda/common/vec4.cuh"
#include "cuda/sm90/dims.hpp"
#include "cuda/sm90/forward/chunks.cuh"
#include "cuda/sm90/forward/intra_gate.cuh"
#include "cuda/sm90/forward/intra_inverse.cuh"
#include "cuda/sm90/forward/intra_p_and_a.cuh"
#include "cuda/sm90/forward/intra_tiles.cuh"
#include "cuda/sm90/fwd_gate_cumsum/scan.cuh"

namespace fkt::cuda {

// kScaled: use_qk_l2norm_in_kernel (IntraTiles).
template <Products kP, typename In, typename Dims, bool kRecompute, bool kScaled, bool kFromT>
__global__ void __launch_bounds__(IntraConfig<In>::kThreads, IntraConfig<In>::template min_blocks<Dims>())
    fwd_intra_kernel(const __grid_constant__ ForwardParams p) {
  static_assert(!(kRecompute && kFromT), "the recompute forms W and U");
  // P and A below the diagonal from fp16 factors (intra_factors.cuh) at the common shape with 16-bit
  // inputs, where the forward forms P and A; the recompute there forms Q_up, K_down and K_up by the
  // same arithmetic (kFactorOperands), so that it keeps the bits of the forward's kept W, Q_up, K_down.
  constexpr bool kFactorOperands = std::is_same_v<Dims, CommonDims> && IntraConfig<In>::kNarrow;
  constexpr bool kFactors = kFactorOperands && !kRecompute;
  static_assert(kFactors || !kFromT, "from T, the factors");
  using Config = IntraConfig<In>;
  constexpr int kSub = Config::kSub, kWarps = Config::kWarps;
  const int64_t chunk = launched_chunk(p, blockIdx.x);
  const ChunkSpan c = chunk_span(p, chunk);
  const int head = blockIdx.y, qk_head = head / (p.HV / p.H);
  const int C = Dims::chunk(p), K = Dims::k(p), V = Dims::v(p), l = static_cast<int>(c.rows);
  const int Kp = Config::padded(K), Vp = Config::padded(V);
  const int live = ceil_div(l, kSub);  // sub-chunks holding tokens
  const IntraLayout<In, kRecompute> L(C, K, V);
  const int ldk = L.ldk, ldv = L.ldv, ldg = L.ldg, ldc = L.ldc;
  extern __shared__ __align__(16) char smem_bytes[];
  In* q = reinterpret_cast<In*>(smem_bytes + L.q);
  In* k = reinterpret_cast<In*>(smem_bytes + L.k);
  float* g = reinterpret_cast<float*>(smem_bytes + L.g);  // a_t (F1's gate), gamma * log2(e), then K_up
  uint16_t* g16 = reinterpret_cast<uint16_t*>(smem_bytes + L.g16);  // a 16-bit g's bits, until the gate reads them
  float* A = reinterpret_cast<float*>(smem_bytes + L.A);
  In* vs = reinterpret_cast<In*>(smem_bytes + L.v);  // once A (k with kRecompute) is dead
  float* T = reinterpret_cast<float*>(smem_bytes + L.T);
  float* Y = reinterpret_cast<float*>(smem_bytes + L.Y);
  float* beta = reinterpret_cast<float*>(smem_bytes + L.beta);
  float* scale_q = reinterpret_cast<float*>(smem_bytes + L.scale_q);
  float* scale_k = reinterpret_cast<float*>(smem_bytes + L.scale_k);
  const IntraTiles<In, kScaled> tiles{q, k, g, A, T, Y, beta, scale_q, scale_k, ldk, ldg, ldc};
  const int tid = threadIdx.x, nthreads = blockDim.x, warp = tid / 32;
  auto row_at = [&](int r) { return (c.first_row + r) * p.HV + head; };  // (token, value head) row
  auto io_at = [&](int r) { return (c.io_row + r) * p.io_HV + head; };  // the same in g, v and beta

  // Rows past the chunk's end and columns past K or V are zero (beta too), so they add nothing.
  const int64_t stride_k = static_cast<int64_t>(p.HV) * K, stride_qk = static_cast<int64_t>(p.io_H) * K;
  const int64_t io_k = static_cast<int64_t>(p.io_HV) * K, io_v = static_cast<int64_t>(p.io_HV) * V;
  const int64_t qk_first = (c.io_row * p.io_H + qk_head) * K;
  const DType g_dtype = p.gate.g_dtype;
  // A 16-bit g takes q's room until F1's first pass has read it; q comes after.
  const bool q_after_gate = g_dtype != DType::kF32;
  auto load_q = [&] {
    if constexpr (Config::kNarrow) {
      copy_rows16_async(q, ldk, static_cast<const In*>(p.q) + qk_first, stride_qk, C, Kp, l, K);
      cp_async_commit();
    } else {
      load_rows_as_float(q, ldk, p.q, p.qk_dtype, qk_first, stride_qk, C, Kp, l, K);
    }
  };
  if (g_dtype == DType::kF32) {
    copy_rows_async(g, ldg, static_cast<const float*>(p.gate.g) + io_at(0) * K, io_k, C, Kp, l, K);
  } else {
    copy_rows16_async(g16, Kp, static_cast<const uint16_t*>(p.gate.g) + io_at(0) * K, io_k, C, Kp, l, K);
  }
  if constexpr (Config::kNarrow) {
    if (!q_after_gate) load_q();
    copy_rows16_async(k, ldk, static_cast<const In*>(p.k) + qk_first, stride_qk, C, Kp, l, K);
  }
  cp_async_commit();
  // v and beta (and the stored T), loaded later: asked into L2 first by the one block of fp32
  // operands an SM. Not by the 16-bit blocks, three an SM, where asking cost more than it saved
  // (the recompute 1.05 -> 0.95 ms without at B1_T8192_H96 on an H100, docs/design.md).
  if constexpr (!Config::kNarrow) {
    const int v_size = element_bytes(p.v_dtype), beta_size = element_bytes(p.beta_dtype);
    prefetch_rows_l2(static_cast<const char*>(p.v) + io_at(0) * V * v_size, v_size * io_v, l, v_size * V);
    for (int r = tid; r < l; r += nthreads) prefetch_l2(static_cast<const char*>(p.beta) + io_at(r) * beta_size);
    if constexpr (kRecompute) prefetch_rows_l2(p.ws.T + io_at(0) * C, 4 * p.io_HV * C, l, 4 * C);
  }
  if constexpr (!Config::kNarrow) {
    if (q_after_gate) load_rows_as_float(k, ldk, p.k, p.qk_dtype, qk_first, stride_qk, C, Kp, l, K);
    else load_rows_as_float<2>({{q, k}}, ldk, {{p.q, p.k}}, p.qk_dtype, qk_first, stride_qk, C, Kp, l, K);
  }
  for (int r = tid; r < C; r += nthreads) {
    beta[r] = r < l ? activate_beta(p.beta_mode, load_float(p.beta, p.beta_dtype, io_at(r))) : 0.f;
  }
  // The gate of this thread's column in F1's first pass, loaded while the copies are in flight.
  const ColumnGate gate = gates_a_column(Kp) ? column_gate(p.gate, head, head * K + min(tid % Kp, K - 1)) : ColumnGate{};
  cp_async_wait<0>();
  __syncthreads();
  // F1 (kda-math.md 3.3), in two passes: the gate of every element into g's tile, then its cumsum.
  if (g_dtype == DType::kBF16) {
    gate_rows(reinterpret_cast<const __nv_bfloat16*>(g16), Kp, g, ldg, C, l, K, Kp, gate);
  } else if (g_dtype == DType::kF16) {
    gate_rows(reinterpret_cast<const __half*>(g16), Kp, g, ldg, C, l, K, Kp, gate);
  } else {
    gate_rows(g, ldg, g, ldg, C, l, K, Kp, gate);
  }
  __syncthreads();
  if (q_after_gate) load_q();
  // gamma, the cumsum of each column in row order as F1 alone sums it: in log2 units in place, and as
  // is for the backward's stages (gamma, and gamma_L for the state passes). Its last row, which every
  // K_down row reads, also goes to the scratch Y (at least Kp floats: (C / 16 - 1) 256 >= Kp for the
  // chunk sizes 32 and 64 and K <= 128 that Problem and check_supported admit), which the inverse
  // takes only once K_down is formed.
  // With the factors' operands, gamma at each sub-chunk's first row goes to Y as well, after its last
  // row: the references of the factors (IntraFactors), which take gamma's room.
  float* g_last = Y;
  for (int d = tid; d < K; d += nthreads) {
    float* gamma = p.ws.gamma != nullptr ? p.ws.gamma + row_at(0) * K + d : nullptr;
    const float total = scan_column(g + d, l, ldg, [](float a) { return a; }, [&](int64_t r, float sum) {
      g[r * ldg + d] = sum * kLog2e;
      if (kFactorOperands && r % kSub == 0) g_last[Kp + r / kSub * Kp + d] = sum * kLog2e;
      if (gamma != nullptr) gamma[r * stride_k] = sum;
    });
    p.ws.g_last[(chunk * p.HV + head) * K + d] = total;
    g_last[d] = total * kLog2e;
  }
  for (int d = K + tid; d < Kp; d += nthreads) g_last[d] = 0.f;
  if (q_after_gate) {
    cp_async_wait<0>();
    __syncthreads();
  }
  if constexpr (kScaled) {
    row_scales(q, l, C, K, ldk, scale_q);
    row_scales(k, l, C, K, ldk, scale_k);
  }
  __syncthreads();
  const bool vector = K % 4 == 0;  // aligned global rows of K floats (of K bf16 operands: 8 bytes)
  if (p.ws.beta_act != nullptr) {  // the backward's recompute keeps what its stages read again
    for (int r = tid; r < l; r += nthreads) p.ws.beta_act[row_at(r)] = beta[r];
    // The row scales, by the first value head of each query/key head (the others compute the same).
    if (kScaled && p.ws.scale_q != nullptr && head % (p.HV / p.H) == 0) {
      for (int r = tid; r < l; r += nthreads) {
        const int64_t at = (c.first_row + r) * p.H + qk_head;
        p.ws.scale_q[at] = scale_q[r];
        p.ws.scale_k[at] = scale_k[r];
      }
    }
  }

  auto load_v = [&] {  // into A's room once A is dead (k's with kRecompute)
    if constexpr (Config::kNarrow) {
      copy_rows16_async(vs, ldv, static_cast<const In*>(p.v) + io_at(0) * V, io_v, C, Vp, l, V);
      cp_async_commit();
    } else {
      load_rows_as_float(vs, ldv, p.v, p.v_dtype, io_at(0) * V, io_v, C, Vp, l, V);
    }
  };
  // T diag(beta) in place, stored as an operand: U = (T diag(beta)) V, then W = (T diag(beta)) K_up.
  auto scale_T_columns = [&] {
    for_each_cell<4>(C, C / 4, 0, ldc, [&](int, int i, int64_t, int s) {
      store4(T + s, map4([](float x, float b) { return as_operand<kP>(x * b); }, load4(T + s), load4(beta + i)));
    });
  };
  // With the factors from U, K_up in bf16 over the second half of gamma's rows (the first holds Kc):
  // W's operand, exact in TF32 as the from-T form stores it for F4.
  __nv_bfloat16* k_up_rows = reinterpret_cast<__nv_bfloat16*>(g) + Kp;
  const int ld_k_up = 2 * ldg;
  // Warp tasks are (row tile, 32 columns); row tile R reads T's columns below 16 (R + 1) only (T is
  // lower triangular). W, K_down and Q_up are stored as operands of the state passes' products
  // (Operand<kP>).
  using Op = Operand<kP>;
  auto product = [&](int width, void* out, DType dtype, auto b) {
    const int groups = ceil_div(width, 32);
    const bool paired = pairs_aligned(out, dtype, width);
    for (int task = warp; task < live * groups; task += kWarps) {
      const int R0 = task / groups * kSub, c0 = task % groups * 32;
      float acc[4][4] = {};
      // Operands TF32 holds exactly: T and K_up stored rounded, v of 16 bits (kTf32 takes bfloat16).
      warp_mma<kP, 4, Config::kNarrow>(acc, 0, R0 + kSub, [&](int r, int i) { return T[(R0 + r) * ldc + i]; },
                                       [&](int i, int e) { return c0 + e < width ? b(i, c0 + e) : 0.f; });
      for_each_acc_pair(acc, [&](int r, int e, float2 pair) {
        if (R0 + r < l && c0 + e < width) {
          store_pair(out, dtype, row_at(R0 + r) * width + c0 + e, pair, c0 + e + 1 < width, paired);
        }
      });
    }
  };
  auto product_U = [&] { product(V, p.ws.U, DType::kF32, [&](int i, int e) { return to_float(vs[i * ldv + e]); }); };
  auto product_W = [&] {
    product(K, p.ws.W, kOperandDType<kP>, [&](int i, int e) {
      if constexpr (kFactors) return to_float(k_up_rows[i * ld_k_up + e]);
      else return g[i * ldg + e];
    });
  };
  // The stores of Q_up = q_hat exp(gamma) and K_down = k_hat exp(gamma_L - gamma) (and from T K_up =
  // k_hat exp(gamma)) of row r < l, columns d .. d + 3.
  Op* q_up = reinterpret_cast<Op*>(p.ws.q_up) + row_at(0) * K;
  Op* k_down = reinterpret_cast<Op*>(p.ws.k_down) + row_at(0) * K;
  Op* k_up = reinterpret_cast<Op*>(p.ws.W) + row_at(0) * K;  // kFromT
  auto store_operands = [&](int r, int d, float4 qu, float4 kd, float4 ku) {
    const int64_t at = r * stride_k + d;
    store_first(q_up + at, qu, K - d, vector);
    store_first(k_down + at, kd, K - d, vector);
    if constexpr (kFromT) store_first(k_up + at, ku, K - d, vector);
  };
  // The stores above from q_hat, k_hat and gamma (kStored) and K_up in place of gamma as an operand
  // (kUp), by `threads` threads.
  auto form_operands = [&](auto stored, auto up_in_place, int thread, int threads) {
    constexpr bool kStored = decltype(stored)::value, kUp = decltype(up_in_place)::value;
    for_each_cell_of<4>(thread, threads, kUp ? C : l, Kp / 4, stride_k, ldg, [&](int r, int d, int64_t, int s) {
      const float4 gr = load4(g + s), kr = tiles.k4(r, d);
      const float4 up = map4([](float x) { return exp2_fast(x); }, gr);
      auto times_up = [&](float4 x) { return map4([](float y, float u) { return y * u; }, x, up); };
      if (kStored && r < l) {
        const float4 down =
            map4([](float kx, float last, float gx) { return kx * exp2_fast(last - gx); }, kr, load4(g_last + d), gr);
        store_operands(r, d, times_up(tiles.q4(r, d)), down, times_up(kr));
      }
      if constexpr (kUp) store4(g + s, map4([](float x) { return as_operand<kP>(x); }, times_up(kr)));
    });
  };

  if constexpr (kRecompute) {
    if constexpr (kFactorOperands) {
      // K_up in place of gamma rounded to bf16, as the forward's W read it.
      const IntraFactors<Dims::chunk(p), Dims::k(p)> factors(tiles);
      auto operands = [&](int r, int d, float4 qu, float4 kd, float4 ku) {
        if (r < l) store_operands(r, d, qu, kd, ku);
        store4(g + r * ldg + d, map4([](float x) { return to_float(from_float<__nv_bfloat16>(x)); }, ku));
      };
      form_factors<Dims::chunk(p), Dims::k(p), false>(tiles, factors, l, operands);
    } else {
      form_operands(std::true_type{}, std::true_type{}, tid, nthreads);
    }
    __syncthreads();
    // q and k are dead: T as stored (rows of the inputs as given, its rows past l zero) into q's
    // room, v into k's.
    copy_rows_async(T, ldc, p.ws.T + io_at(0) * C, static_cast<int64_t>(p.io_HV) * C, C, C, l, C);
    cp_async_commit();
    load_v();
    cp_async_wait<0>();
    __syncthreads();
    scale_T_columns();
    __syncthreads();
    product_U();
    product_W();
  } else {
    if constexpr (kFactors) {
      // Q_up, K_down and K_up from the factors below the diagonal, which take the rooms of q, k and gamma.
      p_and_a_from_factors<kP, Dims::chunk(p), Dims::k(p)>(
          p, tiles, l, row_at(0) * C, [&](int r, int d, float4 qu, float4 kd, float4 ku) {
            if (r < l) store_operands(r, d, qu, kd, ku);
            if constexpr (!kFromT) store_first(k_up_rows + r * ld_k_up + d, ku, K - d, true);
          });
    } else {
      // Q_up and K_down by the warps that P and A leave first; then q is dead and A takes its room.
      p_and_a<kP>(p, tiles, C, Kp, l, row_at(0) * C, [&](int thread, int threads) {
        form_operands(std::true_type{}, std::false_type{}, thread, threads);
      });
      form_operands(std::false_type{}, std::true_type{}, tid, nthreads);
    }
    __syncthreads();
    // k and gamma are dead: T in k's room, then v in A's once T is formed.
    invert<kP>(tiles, C, live);
    if constexpr (kFromT) return store_rows(p.ws.T + row_at(0) * C, static_cast<int64_t>(p.HV) * C, T, ldc, l, C);
    load_v();
    if (p.ws.T != nullptr) store_rows(p.ws.T + row_at(0) * C, static_cast<int64_t>(p.HV) * C, T, ldc, l, C);
    __syncthreads();
    scale_T_columns();
    __syncthreads();
    product_W();
    cp_async_wait<0>();
    __syncthreads();
    product_U();
  }
}

}  // namespace fkt::cuda
