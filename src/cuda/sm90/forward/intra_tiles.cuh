// fwd_intra's block (forward/fwd_intra.cuh): its threads, its shared-memory layout, the tiles
// through which its stages read q_hat and k_hat, and the activated beta and the l2norm row scales
// that it forms first.
#pragma once

#include <type_traits>

#include "cuda/common/activation.cuh"
#include "cuda/common/convert.cuh"
#include "cuda/common/narrow_block.hpp"
#include "cuda/common/round_up.hpp"
#include "cuda/common/vec4.cuh"
#include "cuda/sm90/dims.hpp"
#include "cuda/sm90/forward/params.hpp"

namespace fkt::cuda {

// In: how q, k and v sit in shared memory: 16-bit inputs (q, k and v of one dtype) as given,
// exactly (three blocks per SM at the common shape), anything else widened to fp32.
template <typename In>
struct IntraConfig : NarrowBlock<In> {
  using NarrowBlock<In>::kNarrow;
  static constexpr int kSub = 16;  // sub-chunk rows
  __host__ __device__ static int padded(int x) { return round_up<8>(x); }
  // Resident blocks per SM: three at the common shape (71 KB of shared memory in the forward's
  // layout below, 70 KB in the recompute's, and the 80 registers a thread that three blocks of 256
  // threads leave).
  template <typename Dims>
  static constexpr int min_blocks() {
    if constexpr (!kNarrow) return 1;
    else return std::is_same_v<Dims, CommonDims> ? 3 : 2;
  }
};

// Shared memory, offsets in bytes. Row strides keep the mma fragment reads free of bank conflicts:
// 4 words (mod 32) for operands read as (row g, column t), 8 (mod 32) for B operands read as
// (row t, column g) (g = lane / 4, t = lane % 4); a 16-bit row of Kp + 8 elements is 4 words (mod 32)
// when Kp is a multiple of 64, and two lanes reading one word do not conflict.
// kRecompute (no P, A or inverse) takes three rooms: q's, which holds a 16-bit g as loaded first
// (q then comes after F1's first pass) and T as stored last; k's, which takes v last; and g's.
template <typename In, bool kRecompute = false>
struct IntraLayout {
  int ldk, ldv, ldg, ldc;  // elements: q and k (In), v (In), gamma (fp32), A and T (fp32)
  int q, k, g, g16, A, v, T, Y, beta, scale_q, scale_k, bytes;

  __host__ __device__ IntraLayout(int C, int K, int V) {
    constexpr int kSub = IntraConfig<In>::kSub, kIn = sizeof(In);
    const int Kp = IntraConfig<In>::padded(K), Vp = IntraConfig<In>::padded(V);
    ldk = Kp + (kIn == 2 ? 8 : 4);
    ldv = Vp + 8;
    ldg = Kp + 4;
    ldc = C + 4;
    const int qk_bytes = C * ldk * kIn, v_bytes = C * ldv * kIn, a_bytes = C * ldc * 4, g16_bytes = C * Kp * 2;
    auto larger = [](int x, int y) { return x > y ? x : y; };
    const int room = larger(larger(qk_bytes, a_bytes), larger(v_bytes, g16_bytes));
    q = g16 = 0;  // [C, Kp] a 16-bit g as loaded, then [C, ldk] q as given (l2 norm: scale_q)
    k = room;     // [C, ldk] k as given (l2 norm: scale_k)
    g = 2 * room;  // [C, ldg] a_t, then gamma * log2(e), then K_up
    if constexpr (kRecompute) {
      T = A = q;  // [C, ldc] T as stored (no A)
      v = k;      // [C, ldv] v
    } else {
      A = v = q;  // [C, ldc] A, then [C, ldv] v
      T = k;      // [C, ldc] (I + A)^-1
    }
    // [Kp] gamma's last row, then with 16-bit inputs [C / 16, Kp] gamma at each sub-chunk's first row
    // (intra_factors.cuh); without kRecompute then [C / 16 - 1, 16, 16] partial products of T.
    Y = g + C * ldg * 4;
    const int recompute_y = kIn == 2 ? (1 + C / kSub) * Kp : Kp;
    beta = Y + (kRecompute ? recompute_y : (C / kSub - 1) * kSub * kSub) * 4;  // [C]
    scale_q = beta + C * 4;                         // [C]
    scale_k = scale_q + C * 4;                      // [C]
    bytes = scale_k + C * 4;
  }
};

// The block's shared-memory tiles (IntraLayout) and their row strides, with q_hat and k_hat read as
// fp32: times the row scales of use_qk_l2norm_in_kernel when kScaled, as given otherwise (a multiply
// by scales of 1 cost every operand read a shared load and a multiply).
template <typename In, bool kScaled>
struct IntraTiles {
  In* q;
  In* k;
  float* g;  // a_t (F1's gate), gamma * log2(e), then K_up
  float* A;
  float* T;
  float* Y;
  float* beta;
  float* scale_q;
  float* scale_k;
  int ldk, ldg, ldc;

  __device__ float q_at(int r, int d) const { return scaled(to_float(q[r * ldk + d]), scale_q, r); }
  __device__ float k_at(int r, int d) const { return scaled(to_float(k[r * ldk + d]), scale_k, r); }
  __device__ static float scaled(float x, const float* scale, int r) {
    if constexpr (kScaled) return x * scale[r];
    else return x;
  }
  __device__ float4 q4(int r, int d) const;
  __device__ float4 k4(int r, int d) const;
};

// scale[r] = 1 / sqrt(sum of squares of row r + 1e-6) for the rows r < rows of x [C, K] (row
// stride ld), 1 for the others (kda-math.md 2.3): q_hat = q * scale, formed where it is read, the
// same fp32 product as scaling the rows in place.
template <typename In>
__device__ __forceinline__ void row_scales(const In* x, int rows, int C, int K, int ld, float* scale) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < C; r += IntraConfig<In>::kWarps) {
    float rstd = 1.f;
    if (r < rows) {
      float sum = 0.f;
      for (int d = lane; d < K; d += 32) sum += to_float(x[r * ld + d]) * to_float(x[r * ld + d]);
      for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      rstd = 1.f / sqrtf(sum + 1e-6f);  // as bwd_prepare and the CPU evaluate it
    }
    if (lane == 0) scale[r] = rstd;
  }
}

// Four consecutive elements of a shared-memory row as floats (16-bit rows: one 8-byte load).
template <typename In>
__device__ __forceinline__ float4 load4_as_float(const In* p) {
  if constexpr (sizeof(In) == 4) {
    return load4(p);
  } else {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    const In* e = reinterpret_cast<const In*>(&raw);
    return {to_float(e[0]), to_float(e[1]), to_float(e[2]), to_float(e[3])};
  }
}

template <typename In, bool kScaled>
__device__ __forceinline__ float4 IntraTiles<In, kScaled>::q4(int r, int d) const {
  return map4([&](float x) { return scaled(x, scale_q, r); }, load4_as_float(q + r * ldk + d));
}

template <typename In, bool kScaled>
__device__ __forceinline__ float4 IntraTiles<In, kScaled>::k4(int r, int d) const {
  return map4([&](float x) { return scaled(x, scale_k, r); }, load4_as_float(k + r * ldk + d));
}

}  // namespace fkt::cuda
