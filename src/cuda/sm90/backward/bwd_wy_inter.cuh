// B3 on CUDA, one block per (chunk, value head): the inter-chunk paths (Q_up S, K_down^T delta,
// W S) and the WY representation (U = T diag(beta) V, W = T diag(beta) K_up), as in
// src/cpu/bwd_wy_inter.cpp. Writes dq, dk, dgamma and dbeta partials, dv (final) and dA.
// S = h (state entering the chunk), dS = d_states (gradient of the state leaving it). Every
// product runs on tensor cores (common/mma.cuh); warps own 16-row tiles of the outputs. For bf16
// products and a bf16 dO at the common shape, where both state passes ran on wgmma, the products
// with the states run on wgmma (wy_inter_state_wgmma.cuh; the launch's wy_inter_pass chooses).
#pragma once

#include <type_traits>

#include <cuda_bf16.h>

#include "cuda/common/batched.cuh"
#include "cuda/common/convert.cuh"
#include "cuda/common/round_up.hpp"
#include "cuda/common/tile_copy.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/vec4.cuh"
#include "cuda/sm90/backward/handoffs.cuh"
#include "cuda/sm90/backward/params.hpp"
#include "cuda/sm90/backward/wy_inter_state_wgmma.cuh"
#include "cuda/sm90/dims.hpp"
#include "cuda/sm90/forward/chunks.cuh"
#include "cuda/sm90/forward/state_rows.cuh"

namespace fkt::cuda {

struct WyInterConfig {
  static constexpr int kThreads = 512;
  static constexpr int kCols = 32;   // columns of a warp tile
  static constexpr int kTileV = 32;  // state columns per pass of phase 1
  static constexpr int kRowGroups = 4;  // thread groups splitting the rows of the gamma_L sum
  // Cells (4 columns of a row) of the element-wise passes per thread: C * Kp / 4 <= 64 * 128 / 4.
  static constexpr int kCellsPerThread = 4;
  __host__ __device__ static constexpr int padded(int x) { return round_up<8>(x); }
};

// bf16 products (CommonDims comes with them only) and a bf16 dO at the common shape: the instances
// of B2 and B3 that run on wgmma where backward_state_on_wgmma (backward/launch.cu) holds too (B3:
// its products with the states, wy_inter_state_products), else B2's mma.sync pass and RuntimeDims's
// B3.
template <typename Dims, typename DoT>
inline constexpr bool kBf16DoAtCommonShape = std::is_same_v<Dims, CommonDims> && std::is_same_v<DoT, __nv_bfloat16>;

// fp32 shared memory, offsets in floats; row strides 4 (mod 32) keep the mma operand reads of
// (row g, column t) free of bank conflicts, T's stride 8 (mod 32) its transposed reads.
struct WyInterLayout {
  int ldb = 0, lds = 0, ldt = 0, ldv = 0;
  int b0 = 0, b1 = 0, b2 = 0, region = 0, carry = 0, part = 0, rows_part = 0, dots = 0, beta = 0, bars = 0,
      floats = 0;
  // Phase-1 tiles inside the region: S, dS [Kp, lds], dO, delta, d_delta [C, lds] (unused with
  // state_tiles, whose tiles start at 0 and cover B0 to B2 and the region).
  int s = 0, ds = 0, tile_do = 0, tile_delta = 0, tile_dd = 0;
  // Later in the region: T [C, ldt], d_delta and v [C, ldv].
  int t = 0, dd = 0, v = 0;

  // state_tiles: room for wy_inter_state_products's tiles (WyInterStateTiles) below carry.
  __host__ __device__ constexpr WyInterLayout(int C, int K, int V, bool state_tiles) {
    const int Kp = WyInterConfig::padded(K), Vp = WyInterConfig::padded(V);
    ldb = (Kp > C ? Kp : C) + 4;
    lds = WyInterConfig::kTileV + 4;
    ldt = C + 8;
    ldv = Vp + 4;
    b0 = 0;
    b1 = b0 + C * ldb;
    b2 = b1 + C * ldb;
    region = b2 + C * ldb;
    s = region;
    ds = s + Kp * lds;
    tile_do = ds + Kp * lds;
    tile_delta = tile_do + C * lds;
    tile_dd = tile_delta + C * lds;
    t = region;
    dd = t + C * ldt;
    v = dd + C * ldv;
    const int phase1_end = state_tiles ? WyInterStateTiles::bytes / 4 : tile_dd + C * lds, later_end = v + C * ldv;
    carry = phase1_end > later_end ? phase1_end : later_end;  // [K]
    part = carry + K;                                          // [Vp / 32, C] dbeta parts of Y_u . v
    rows_part = part + ceil_div(Vp, WyInterConfig::kCols) * C;  // [kRowGroups, K]
    dots = rows_part + WyInterConfig::kRowGroups * K;           // [C, Kp / 4 + 1] Y_w . K_up by 4-column cells
    beta = dots + C * (Kp / 4 + 1);             // [C] beta_act of the rows, zero past the chunk's end
    bars = round_up<2>(beta + C);               // mbarriers (wy_inter_state_products)
    floats = bars + 2 * WyInterStateTiles::kTiles;
  }
  // The launch's bytes: with the state products on wgmma, room to align the base for TMA boxes.
  static constexpr int kAlign = 1024;
  static size_t bytes(int C, int K, int V, bool state_wgmma) {
    return sizeof(float) * WyInterLayout(C, K, V, state_wgmma).floats + (state_wgmma ? kAlign : 0);
  }
};
static_assert(64 * 128 / 4 <= WyInterConfig::kCellsPerThread * WyInterConfig::kThreads,
              "every cell of the largest chunk (C = 64, K = 128) has its thread");
static_assert(sizeof(float) * WyInterLayout(64, 128, 128, true).floats + WyInterLayout::kAlign <= 227 * 1024,
              "B3 with the state tiles fits an SM's shared memory");

// DoT: dO in shared memory, 16-bit as given (with_d_o_storage) or widened to fp32.
template <Products kP, typename Dims, typename DoT>
__global__ void __launch_bounds__(WyInterConfig::kThreads)
    bwd_wy_inter_kernel(const __grid_constant__ WyInterParams params) {
  constexpr int kTile = WyInterConfig::kTileV;
  constexpr bool kStateWgmma = kBf16DoAtCommonShape<Dims, DoT>;
  const BackwardParams& p = params.p;
  const ForwardParams& f = p.fwd;
  const int64_t chunk = blockIdx.x;
  const ChunkSpan c = chunk_span(f, chunk);
  const int head = blockIdx.y, C = Dims::chunk(f), K = Dims::k(f), V = Dims::v(f), l = static_cast<int>(c.rows);
  const int Kp = WyInterConfig::padded(K), Vp = WyInterConfig::padded(V);
  const WyInterLayout L(C, K, V, kStateWgmma);
  const int ldb = L.ldb, lds = L.lds, ldt = L.ldt, ldv = L.ldv;
  static_assert(!kStateWgmma || WyInterStateTiles::kThreads == WyInterConfig::kThreads, "four warpgroups");
  extern __shared__ __align__(1024) char wy_inter_smem[];
  float* const smem =
      reinterpret_cast<float*>(kStateWgmma ? align_shared<WyInterLayout::kAlign>(wy_inter_smem) : wy_inter_smem);
  float* B0 = smem + L.b0;  // dO S^T, then Y_w = T^T dW, then dT
  float* B1 = smem + L.b1;  // delta dS^T, then dk_inter, then K_up, then Z = tril(dT) T^T
  float* B2 = smem + L.b2;  // d_delta S^T, then dW
  float* carry = smem + L.carry;  // [K] sum_e S[d, e] dS[d, e]
  float* part = smem + L.part;
  float* rows_part = smem + L.rows_part;
  float* dots = smem + L.dots;
  float* betas = smem + L.beta;
  const int tid = threadIdx.x, nthreads = blockDim.x, warp = tid / 32, lane = tid % 32;
  const int64_t state = (chunk * f.HV + head) * static_cast<int64_t>(K) * V;
  auto row_at = [&](int r) { return (c.first_row + r) * f.HV + head; };  // (token, value head) row
  auto io_at = [&](int r) { return (c.io_row + r) * f.io_HV + head; };  // the same in v, dO and dv
  const int64_t io_v = static_cast<int64_t>(f.io_HV) * V;
  // Warp tiles of a [C, width] output: 16 rows x 32 columns, at most 16 of them (C, width <= 128).
  constexpr int kCols = WyInterConfig::kCols, kN = kCols / 8;
  auto tile_of = [&](int width) {
    const int groups = ceil_div(width, kCols);
    return int3{warp < C / 16 * groups, warp / groups * 16, warp % groups * kCols};
  };

  // beta_act of row tid, loaded now and stored after phase 1 (which reads it not): the load waits
  // behind phase 1's copies, not phase 1 behind it.
  static_assert(64 <= WyInterConfig::kThreads, "a thread per row of the largest chunk");
  const float beta_row = tid < l ? f.ws.beta_act[row_at(tid)] : 0.f;
  // Phase 1: B0 = dO S^T, B1 = delta dS^T, B2 = d_delta S^T (accumulated over V-tiles in
  // registers), carry = rowsum(S * dS). Rows past the chunk's end and padding are zero.
  if constexpr (kStateWgmma) {
    wy_inter_state_products(params, c, chunk, head, reinterpret_cast<char*>(smem),
                            reinterpret_cast<uint64_t*>(smem + L.bars), B0, B1, B2, ldb, carry);
  } else {
    float* S = smem + L.s;
    float* dS = smem + L.ds;
    // 16-bit dO rows: 8 (mod 64) elements, two lanes per word, free of bank conflicts too.
    DoT* tile_do = reinterpret_cast<DoT*>(smem + L.tile_do);
    const int ldo = sizeof(DoT) == 2 ? kTile + 8 : lds;
    float* tile_delta = smem + L.tile_delta;
    float* tile_dd = smem + L.tile_dd;
    const int3 w = tile_of(Kp);
    const int R0 = w.y, c0 = w.z;
    float acc0[kN][4] = {}, acc1[kN][4] = {}, acc2[kN][4] = {};
    for (int d = tid; d < K; d += nthreads) carry[d] = 0.f;
    for (int e0 = 0; e0 < V; e0 += kTile) {
      const int width = min(kTile, V - e0);
      __syncthreads();
      const int64_t stride_v = static_cast<int64_t>(f.HV) * V;
      load_state_rows(S, lds, f.ws, chunk * f.HV + head, K, V, e0, Kp, kTile, width);
      copy_rows_async(dS, lds, static_cast<const float*>(p.ws.d_states) + state + e0, V, Kp, kTile, K, width);
      copy_rows_async(tile_delta, lds, f.ws.delta + row_at(0) * V + e0, stride_v, C, kTile, l, width);
      copy_rows_async(tile_dd, lds, p.ws.d_delta + row_at(0) * V + e0, stride_v, C, kTile, l, width);
      if constexpr (sizeof(DoT) == 2) {
        copy_rows16_async(tile_do, ldo, static_cast<const DoT*>(p.d_o) + io_at(0) * V + e0, io_v, C, kTile, l, width);
      }
      cp_async_commit();
      if constexpr (sizeof(DoT) == 4) {
        load_rows_as_float(tile_do, ldo, p.d_o, p.d_o_dtype, io_at(0) * V + e0, io_v, C, kTile, l, width);
      }
      cp_async_wait<0>();
      __syncthreads();
      if (w.x) {
        const int g = lane / 4, t = lane % 4;
        for (int k = 0; k < kTile; k += 8) {
          const FragA fo =
              load_frag_a<kP, sizeof(DoT) == 2>([&](int r, int e) { return to_float(tile_do[(R0 + r) * ldo + e]); }, k);
          const FragA fl = load_frag_a<kP>([&](int r, int e) { return tile_delta[(R0 + r) * lds + e]; }, k);
          const FragA fd = load_frag_a<kP>([&](int r, int e) { return tile_dd[(R0 + r) * lds + e]; }, k);
#pragma unroll
          for (int n = 0; n < kN; ++n) {
            const int d = c0 + 8 * n + g;
            if (c0 + 8 * n >= Kp) break;
            const SplitTf32 s0 = split_tf32<kP>(S[d * lds + k + t]), s1 = split_tf32<kP>(S[d * lds + k + t + 4]);
            mma_split<kP>(acc0[n], fo, s0, s1);
            mma_split<kP>(acc2[n], fd, s0, s1);
            mma_split<kP>(acc1[n], fl, split_tf32<kP>(dS[d * lds + k + t]), split_tf32<kP>(dS[d * lds + k + t + 4]));
          }
        }
      }
      for (int d = tid; d < K; d += nthreads) {
        float acc = 0.f;
        for (int e = 0; e < width; ++e) acc += S[d * lds + e] * dS[d * lds + e];
        carry[d] += acc;
      }
    }
    if (w.x) {
      for_each_acc(acc0, [&](int r, int d, float x) { if (c0 + d < Kp) B0[(R0 + r) * ldb + c0 + d] = x; });
      for_each_acc(acc1, [&](int r, int d, float x) { if (c0 + d < Kp) B1[(R0 + r) * ldb + c0 + d] = x; });
      for_each_acc(acc2, [&](int r, int d, float x) { if (c0 + d < Kp) B2[(R0 + r) * ldb + c0 + d] = x; });
    }
  }
  if (tid < C) betas[tid] = beta_row;
  __syncthreads();
  // T and d_delta into the region, which phase 1 has finished with, while phase 2 runs.
  float* T = smem + L.t;    // [C, ldt]
  float* dd = smem + L.dd;  // [C, ldv]
  float* vs = smem + L.v;   // [C, ldv]
  copy_rows_async(T, ldt, f.ws.T + io_at(0) * C, static_cast<int64_t>(f.io_HV) * C, C, C, l, C);  // input rows
  copy_rows_async(dd, ldv, p.ws.d_delta + row_at(0) * V, static_cast<int64_t>(f.HV) * V, C, Vp, l, V);
  cp_async_commit();

  // Phase 2: dq_inter, dk_inter, dW and the first dgamma terms; then v into the region.
  // The element-wise passes below take 4 columns of a row per step (cells); global rows of K floats
  // are 16-byte aligned when K is a multiple of 4. Columns past K and rows past the chunk's end load
  // as zero, so the shared-memory results there are zero (mma operands below need zero padding).
  const float* gamma = f.ws.gamma;
  const int64_t last = row_at(l - 1) * K;
  const int cells = Kp / 4;
  const bool vector = K % 4 == 0, bf16_partials = bf16_qk_partials<kP>(p);
  // q_hat and k_hat as F2 forms them (forward/workspace.hpp): q and k of the value head's query/key
  // head as given, times the row scales of l2norm; rows past the chunk's end read as zero.
  const int qk_head = head / (f.HV / f.H), qk_bytes = element_bytes(f.qk_dtype);
  const bool qk_vector = vector && reinterpret_cast<uintptr_t>(f.q) % (4 * qk_bytes) == 0 &&
                         reinterpret_cast<uintptr_t>(f.k) % (4 * qk_bytes) == 0;
  auto qk_row = [&](int r) { return (c.first_row + r) * f.H + qk_head; };  // in the row scales
  auto io_qk_row = [&](int r) { return (c.io_row + r) * f.io_H + qk_head; };  // in q and k
  // kTf32 runs for bf16 inputs only (products_for), so q and k are bf16 there: typed loads.
  auto hat4 = [&](const void* x, const float* scale, int r, int d, int n) {
    if (n <= 0) return float4{0.f, 0.f, 0.f, 0.f};
    const int64_t at = io_qk_row(r) * K + d;
    float4 v;
    if constexpr (kP == Products::kTf32) {
      if (qk_vector && n >= 4) {
        const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(x) + at);
        const float2 lo = load2(reinterpret_cast<const __nv_bfloat16*>(&raw.x));
        const float2 hi = load2(reinterpret_cast<const __nv_bfloat16*>(&raw.y));
        v = float4{lo.x, lo.y, hi.x, hi.y};
      } else {
        v = load_first(x, DType::kBF16, at, n, false);
      }
    } else {
      v = load_first(x, f.qk_dtype, at, n, qk_vector);
    }
    if (scale == nullptr) return v;
    const float s = scale[qk_row(r)];
    return map4([&](float e) { return e * s; }, v);
  };
  struct Rows4 {
    float4 a, b, c, d;
  };
  // What a thread keeps of each of its cells from phase 2 to the dk pass below, in registers:
  // exp(gamma), k_hat and dgamma so far (no global round trip, no second load of gamma or k).
  constexpr int kCells = WyInterConfig::kCellsPerThread;
  struct Kept {
    float4 up, k_hat, dgamma;
  };
  Kept kept[kCells];
  batched_cells<kCells, 2>(
      C * cells,
      [&](int x) {  // gamma, gamma of the last row, q_hat, k_hat
        const int r = x / cells, d = x % cells * 4, n = r < l ? K - d : 0;
        const int64_t at = row_at(r) * K + d;
        return Rows4{load_first(gamma + at, n, vector), load_first(gamma + last + d, n, vector),
                     hat4(f.q, f.ws.scale_q, r, d, n), hat4(f.k, f.ws.scale_k, r, d, n)};
      },
      [&](int j, int x, Rows4 v) {
        const int r = x / cells, d = x % cells * 4, at = r * ldb + d;
        const float4 up = map4([](float g) { return expf(g); }, v.a), b0 = load4(B0 + at);
        kept[j] = Kept{up, v.d, float4{0.f, 0.f, 0.f, 0.f}};
        store4(B0 + at, v.d);  // k_hat over dO S^T, read above: for the gamma_L row sums below
        if (r >= l) return store4(B2 + at, float4{0.f, 0.f, 0.f, 0.f});
        const float4 dq = map4([&](float b, float u) { return f.scale * b * u; }, b0, up);
        const float4 dk_inter =
            map4([](float b1, float gl, float g) { return b1 * expf(gl - g); }, load4(B1 + at), v.b, v.a);
        store4(B1 + at, dk_inter);
        store4(B2 + at, map4([](float b2) { return -b2; }, load4(B2 + at)));
        store_partial(p.ws.dq, row_at(r), K, d, dq, K - d, vector, bf16_partials);
        kept[j].dgamma =
            map4([](float q, float dqx, float k, float dki) { return q * dqx - k * dki; }, v.c, dq, v.d, dk_inter);
      });
  load_rows_as_float(vs, ldv, f.v, f.v_dtype, io_at(0) * V, io_v, C, Vp, l, V);
  cp_async_wait<0>();
  __syncthreads();

  // The last row's dgamma gets the gamma_L terms: sum_r k_hat[r, d] dk_inter[r, d] (B0 and B1 now),
  // rows split over kRowGroups thread groups, the groups summed in a fixed order in the dk pass.
  constexpr int kRowGroups = WyInterConfig::kRowGroups;
  for (int x = tid; x < kRowGroups * K; x += nthreads) {
    const int d = x % K, group = x / K;
    float acc = 0.f;
    for (int r = group; r < l; r += kRowGroups) acc += B0[r * ldb + d] * B1[r * ldb + d];
    rows_part[group * K + d] = acc;
  }
  __syncthreads();

  // Phase 3: B0 = Y_w = T^T dW; Y_u = T^T d_delta, dv = beta Y_u and the Y_u . v part of dbeta.
  // Row tile I of T^T reads rows r >= I of T (lower triangular).
  if (const int3 w = tile_of(Kp); w.x) {
    float acc[kN][4] = {};
    warp_mma<kP, kN>(acc, w.y, C, [&](int i, int r) { return T[r * ldt + w.y + i]; },
                     [&](int r, int d) { return w.z + d < Kp ? B2[r * ldb + w.z + d] : 0.f; });
    for_each_acc(acc, [&](int i, int d, float x) { if (w.z + d < Kp) B0[(w.y + i) * ldb + w.z + d] = x; });
  }
  if (const int3 w = tile_of(Vp); w.x) {
    float acc[kN][4] = {};
    warp_mma<kP, kN>(acc, w.y, C, [&](int i, int r) { return T[r * ldt + w.y + i]; },
                     [&](int r, int e) { return w.z + e < Vp ? dd[r * ldv + w.z + e] : 0.f; });
    float row_sum[2] = {0.f, 0.f}, beta[2];  // rows g and g + 8 of the tile, this lane's columns
    for (int h = 0; h < 2; ++h) {
      const int row = w.y + lane / 4 + 8 * h;
      beta[h] = betas[row];
    }
    const bool paired = p.dv != nullptr && pairs_aligned(p.dv, p.dv_dtype, V);
    for_each_acc_pair(acc, [&](int i, int e, float2 yu) {
      const int row = w.y + i, col = w.z + e;
      if (row >= l || col >= V) return;
      const bool both = col + 1 < V;
      if (p.dv != nullptr) {
        store_pair(p.dv, p.dv_dtype, io_at(row) * V + col, make_float2(beta[i >= 8] * yu.x, beta[i >= 8] * yu.y), both,
                   paired);
      }
      row_sum[i >= 8] += yu.x * vs[row * ldv + col];
      if (both) row_sum[i >= 8] += yu.y * vs[row * ldv + col + 1];
    });
    for (int offset = 1; offset < 4; offset *= 2) {  // the four lanes of a row, in a fixed order
      row_sum[0] += __shfl_xor_sync(0xffffffffu, row_sum[0], offset);
      row_sum[1] += __shfl_xor_sync(0xffffffffu, row_sum[1], offset);
    }
    if (lane % 4 == 0) {
      part[w.z / kCols * C + w.y + lane / 4] = row_sum[0];
      part[w.z / kCols * C + w.y + lane / 4 + 8] = row_sum[1];
    }
  }
  __syncthreads();

  // dk = dk_inter + beta exp(gamma) Y_w, dgamma += beta K_up Y_w (the last row's gamma_L terms
  // first: exp(gamma_L) carry and the row sums), then B1 = K_up (zero padded): each element read and
  // rewritten by one thread; each cell's part of Y_w . K_up (dbeta) to dots.
  batched_cells<kCells, 2>(
      C * cells, [&](int x) { return betas[x / cells]; },
      [&](int j, int x, float beta) {
        const int r = x / cells, d = x % cells * 4, at = r * ldb + d;
        const float4 up = kept[j].up, k_hat = kept[j].k_hat, yw = load4(B0 + at);
        const float4 k_up = map4([](float k, float u) { return k * u; }, k_hat, up);
        if (r < l) {
          float4 dg = kept[j].dgamma;
          if (r == l - 1) {
            float g[4] = {dg.x, dg.y, dg.z, dg.w};
            const float u[4] = {up.x, up.y, up.z, up.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              if (d + e >= K) continue;
              float acc = u[e] * carry[d + e];
              for (int group = 0; group < kRowGroups; ++group) acc += rows_part[group * K + d + e];
              g[e] += acc;
            }
            dg = float4{g[0], g[1], g[2], g[3]};
          }
          const int64_t global = row_at(r) * K + d;
          store_partial(p.ws.dk, row_at(r), K, d,
                        map4([&](float dki, float u, float y) { return dki + beta * u * y; }, load4(B1 + at), up, yw),
                        K - d, vector, bf16_partials);
          const float4 beta_k_up = map4([&](float k, float u) { return beta * k * u; }, k_hat, up);
          const float4 dgamma = map4([](float g, float bku, float y) { return g + bku * y; }, dg, beta_k_up, yw);
          store_first(p.ws.dgamma + global, dgamma, K - d, vector);
          dots[r * (cells + 1) + d / 4] = dot4(k_up, yw);
        }
        store4(B1 + at, k_up);
      });
  __syncthreads();
  // dbeta = Y_u . v + Y_w . K_up, the parts summed in a fixed order.
  for (int r = tid; r < l; r += nthreads) {
    float db = 0.f;
    for (int group = 0; group < ceil_div(Vp, kCols); ++group) db += part[group * C + r];
    for (int cell = 0; cell < cells; ++cell) db += dots[r * (cells + 1) + cell];
    p.ws.dbeta[row_at(r)] = db;
  }

  // The [C, C] products: warp tiles of 16 rows x 16 columns.
  const bool square = warp < C / 16 * (C / 16);
  const int R0 = warp / (C / 16) * 16, c0 = warp % (C / 16) * 16;
  // Phase 4: B0 = dT[r, i] = beta_i (d_delta_r . v_i + dW_r . K_up_i) for i < r.
  if (square) {
    float acc[2][4] = {};
    warp_mma<kP, 2>(acc, 0, Vp, [&](int r, int e) { return dd[(R0 + r) * ldv + e]; },
                    [&](int e, int i) { return vs[(c0 + i) * ldv + e]; });
    warp_mma<kP, 2>(acc, 0, Kp, [&](int r, int d) { return B2[(R0 + r) * ldb + d]; },
                    [&](int d, int i) { return B1[(c0 + i) * ldb + d]; });
    for_each_acc(acc, [&](int r, int i, float x) {
      const int row = R0 + r, col = c0 + i;
      B0[row * ldb + col] = col < row && row < l ? betas[col] * x : 0.f;
    });
  }
  __syncthreads();
  // Phase 5: B1 = Z = tril(dT) T^T, Z[m, i] = sum_{n < m, n <= i} dT[m, n] T[i, n].
  if (square) {
    float acc[2][4] = {};
    warp_mma<kP, 2>(acc, 0, R0 + 16, [&](int m, int n) { return B0[(R0 + m) * ldb + n]; },
                    [&](int n, int i) { return T[(c0 + i) * ldt + n]; });
    for_each_acc(acc, [&](int m, int i, float x) { B1[(R0 + m) * ldb + c0 + i] = x; });
  }
  __syncthreads();
  // Phase 6: dA[r, i] = -sum_{m >= r} T[m, r] Z[m, i] for i < r (every column written).
  if (square) {
    float acc[2][4] = {};
    warp_mma<kP, 2>(acc, R0, C, [&](int r, int m) { return T[m * ldt + R0 + r]; },
                    [&](int m, int i) { return B1[m * ldb + c0 + i]; });
    for_each_acc(acc, [&](int r, int i, float x) {
      const int row = R0 + r, col = c0 + i;
      if (row >= l) return;
      const float dA = col < row ? -x : 0.f;
      if constexpr (kBf16DA<kP>) bf16_row(p.ws.dA, row_at(row), C)[col] = __float2bfloat16_rn(dA);
      else p.ws.dA[row_at(row) * C + col] = dA;
    });
  }
}

}  // namespace fkt::cuda
