// F2's P and A below the diagonal from fp16 factors (docs/design.md, "P and A between sub-chunks
// from fp16 factors"), inside fwd_intra at the common shape with 16-bit inputs.
// For a block (R, J), J < R, of 16-row sub-chunks, with R0 = 16 R and n = 16 (J + 1):
//   P[r, i] = s sum_d Qf[r, d] c[d] Kc[i, d],  A[r, i] = beta_r sum_d Kr[r, d] c[d] Kc[i, d]
//   Qf = q_hat exp(g_r - g_R0), Kr = k_hat exp(g_r - g_R0), Kc = k_hat exp(g_n - g_i), c = exp(g_R0 - g_n)
// Every factor is at most 1 (times q_hat or k_hat), and each is formed once a chunk: Qf and Kr of a
// row of sub-chunk R, Kc of a row of sub-chunk J. Stored in fp16 with a power-of-two scale a row
// (common/scaled_half.cuh: TF32's 11 significant bits down to 2^-14 of the row's largest), the
// products are fp16 mma with fp32 accumulators.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>

#include "cuda/common/fast_exp.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/mma_f16.cuh"
#include "cuda/common/scaled_half.cuh"
#include "cuda/common/vec4.cuh"
#include "cuda/sm90/forward/intra_tiles.cuh"

namespace fkt::cuda {

// Where the factors live in fwd_intra's shared memory (IntraLayout) at C = kC, K = kK: Qf over q and
// Kr over k (16-bit rows, the same strides), Kc over the first half of each fp32 row of gamma;
// gamma's last row, gamma at each sub-chunk's first row (`refs`, both written by F1's cumsum) and
// Kc's row scales in the scratch Y; Qf's and Kr's row scales over the l2norm row scales, which the
// formation reads for the last time, row by row, before it overwrites them.
template <int kC, int kK>
struct IntraFactors {
  static constexpr int kSub = 16, kSubs = kC / kSub;
  __half* qf;
  __half* kr;
  __half* kc;
  const float* g_last;  // [kK]
  const float* refs;    // [kSubs, kK]
  float* scale_qf;
  float* scale_kr;
  float* scale_kc;
  int ldk, ld_kc;

  template <typename In, bool kScaled>
  __device__ explicit IntraFactors(const IntraTiles<In, kScaled>& t)
      : qf(reinterpret_cast<__half*>(t.q)),
        kr(reinterpret_cast<__half*>(t.k)),
        kc(reinterpret_cast<__half*>(t.g)),
        g_last(t.Y),
        refs(t.Y + kK),
        scale_qf(t.scale_q),
        scale_kr(t.scale_k),
        scale_kc(t.Y + kK + kSubs * kK),
        ldk(t.ldk),
        ld_kc(2 * t.ldg) {
    static_assert(sizeof(In) == 2, "Qf and Kr take the rooms of 16-bit q and k");
    // Y holds (kC / 16 - 1) 256 floats (IntraLayout): gamma's last row, the references, Kc's scales.
    static_assert(kK + kSubs * kK + kC <= (kSubs - 1) * kSub * kSub, "the scratch Y holds the factors' vectors");
  }
};

// The least power of two at or above the largest magnitude of the warp's 4 x 32 values: magnitudes
// order as their bits do, so one redux.sync finds the largest.
__device__ __forceinline__ float warp_row_scale(float4 x) {
  const float m = fmaxf(fmaxf(fabsf(x.x), fabsf(x.y)), fmaxf(fabsf(x.z), fabsf(x.w)));
  return power_of_two_at_least(__uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(m))));
}

// x / scale as four fp16 at p (8-byte aligned). 1 / scale by its exponent's bits: exact for the
// scales of power_of_two_at_least up to 2^126 (factors whose magnitudes reach 2^126 would overflow
// the fp32 products anyway).
__device__ __forceinline__ void store_halves(__half* p, float4 x, float scale) {
  *reinterpret_cast<uint2*>(p) = scaled_halves(x, __uint_as_float(0x7f000000u - __float_as_uint(scale)));
}

// The factors of every row of the chunk (l rows; kStore: stored, else only formed for the operands
// of the backward's recompute, which keeps the forward's bits) and the state passes' operands of its
// values: operands(r, d, Q_up, K_down, K_up) at columns d .. d + 3 (zero for r >= l), with Q_up =
// Qf exp(g_R0), K_up = Kr exp(g_R0) and K_down = Kc exp(g_L - g_n) (n = L where no block reads
// Kc), products of the factors before their rounding. With kStore operands is called once the warp
// has read the row and may overwrite gamma's row; without, before the other lanes are done, and may
// overwrite the lane's own columns of it only. Warps 2R and 2R + 1 take the rows of sub-chunk R,
// eight each, a lane four columns, so that a lane forms exp(g_R0) and exp(g_L - g_n) once: two
// exponentials an element. The factors are zero where no block below the diagonal reads them and
// past the chunk's end.
template <int kC, int kK, bool kStore = true, typename In, bool kScaled, typename Operands>
__device__ __forceinline__ void form_factors(const IntraTiles<In, kScaled>& tiles, const IntraFactors<kC, kK>& f, int l,
                                             Operands operands) {
  static_assert(kK == 4 * 32, "a lane takes four columns of a row");
  constexpr int kSub = IntraFactors<kC, kK>::kSub, kSubs = IntraFactors<kC, kK>::kSubs;
  static_assert(IntraConfig<In>::kWarps == 2 * kSubs, "two warps a sub-chunk");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, d = 4 * lane, R = warp / 2;
  const bool rows_read = R > 0;                                      // by the blocks (R, J < R)
  const bool cols_read = R + 1 < kSubs && kSub * (R + 1) < l;        // by the blocks (R' > R, R)
  const float4 g_r0 = load4(f.refs + R * kK + d), g_end = load4(f.g_last + d);
  const float4 g_n = cols_read ? load4(f.refs + (R + 1) * kK + d) : g_end;
  const float4 up_r0 = map4([](float x) { return exp2_fast(x); }, g_r0);
  const float4 down_n = map4([](float end, float n) { return exp2_fast(end - n); }, g_end, g_n);
  auto times = [](float4 a, float4 b) { return map4([](float x, float y) { return x * y; }, a, b); };
  const int first = R * kSub + warp % 2 * (kSub / 2);
  for (int r = first; r < first + kSub / 2; ++r) {
    float4 qf{}, kf{}, kc{}, q_up{}, k_down{}, k_up{};
    if (r < l) {
      const float4 gr = load4(tiles.g + r * tiles.ldg + d), qr = tiles.q4(r, d), kr = tiles.k4(r, d);
      const float4 row = map4([](float x, float ref) { return exp2_fast(x - ref); }, gr, g_r0);  // exp(g_r - g_R0)
      const float4 col = map4([](float x, float n) { return exp2_fast(n - x); }, gr, g_n);      // exp(g_n - g_r)
      qf = times(qr, row);
      kf = times(kr, row);
      kc = times(kr, col);
      q_up = times(qf, up_r0);
      k_down = times(kc, down_n);
      k_up = times(kf, up_r0);
      if (!rows_read) qf = kf = float4{};
      if (!cols_read) kc = float4{};
    }
    if constexpr (!kStore) {
      operands(r, d, q_up, k_down, k_up);
      continue;
    }
    const float sq = warp_row_scale(qf), sk = warp_row_scale(kf), sc = warp_row_scale(kc);
    __syncwarp();  // every lane has read its part of g's row and the l2norm scale, which the stores overwrite
    operands(r, d, q_up, k_down, k_up);
    store_halves(f.qf + r * f.ldk + d, qf, sq);
    store_halves(f.kr + r * f.ldk + d, kf, sk);
    store_halves(f.kc + r * f.ld_kc + d, kc, sc);
    if (lane == 0) {
      f.scale_qf[r] = sq;
      f.scale_kr[r] = sk;
      f.scale_kc[r] = sc;
    }
  }
}

// acc_p = Qf (c Kc)^T and acc_a = Kr (c Kc)^T for the block (R, J) below the diagonal, with the row
// scales applied (beta and the op's scale are the caller's). c is 1 next to the diagonal (n = R0).
template <int kC, int kK>
__device__ __forceinline__ void factored_block(const IntraFactors<kC, kK>& f, int R, int J, float (&acc_p)[2][4],
                                               float (&acc_a)[2][4]) {
  constexpr int kSub = IntraFactors<kC, kK>::kSub;
  const int t = threadIdx.x % 4;
  const __half* q_row = a_fragment_row(f.qf + R * kSub * f.ldk, f.ldk);
  const __half* k_row = a_fragment_row(f.kr + R * kSub * f.ldk, f.ldk);
  const __half* c_row = b_fragments_row(f.kc + J * kSub * f.ld_kc, f.ld_kc);
  const float* g_r0 = f.refs + R * kK;
  const float* g_n = f.refs + (J + 1) * kK;
  const bool decays = J + 1 < R;
#pragma unroll
  for (int d0 = 0; d0 < kK; d0 += 16) {
    uint32_t a_q[4], a_k[4], b[4];
    ldmatrix_x4(a_q, q_row + d0);
    ldmatrix_x4(a_k, k_row + d0);
    ldmatrix_x4(b, c_row + d0);
    if (decays) {  // c at the lane's columns 2t, 2t + 1 (b0 of both n-tiles) and 2t + 8, 2t + 9 (b1)
      const int d = d0 + 2 * t;
      auto c = [&](int at) {
        const float2 ref = load2(g_r0 + at), next = load2(g_n + at);
        return half_pair(exp2_fast(ref.x - next.x), exp2_fast(ref.y - next.y));
      };
      const uint32_t c_low = c(d), c_high = c(d + 8);
      b[0] = half_pair_product(b[0], c_low);
      b[1] = half_pair_product(b[1], c_high);
      b[2] = half_pair_product(b[2], c_low);
      b[3] = half_pair_product(b[3], c_high);
    }
    mma_f16(acc_p[0], a_q, b[0], b[1]);
    mma_f16(acc_p[1], a_q, b[2], b[3]);
    mma_f16(acc_a[0], a_k, b[0], b[1]);
    mma_f16(acc_a[1], a_k, b[2], b[3]);
  }
  const float* sc = f.scale_kc + J * kSub;
  transform_acc(acc_p, [&](int r, int i, float x) { return x * f.scale_qf[R * kSub + r] * sc[i]; });
  transform_acc(acc_a, [&](int r, int i, float x) { return x * f.scale_kr[R * kSub + r] * sc[i]; });
}

}  // namespace fkt::cuda
