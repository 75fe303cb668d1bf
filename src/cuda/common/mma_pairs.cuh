// Tensor-core products (common/mma.cuh) whose fragments a lane reads as adjacent pairs: one 64-bit
// shared-memory load for two elements, and no conversion for kTf32.
//
// The mma sums over k, so any order of k that A and B share gives the same product: here logical
// k = t and k = t + 4 of a k-step at k0 are the adjacent k0 + 2t and k0 + 2t + 1. An operand stored
// with k along its rows ("k rows") is then read in pairs. An A operand stored with m along its rows
// ("m rows", the transposed operand of a K^T V product) is read in pairs when its rows interleave:
// fragment rows g and g + 8 are the adjacent 2g and 2g + 1, and so are the accumulator's rows
// (acc_row<true>). The B operand of an "n rows" layout ([k][n]) is read one element at a time.
//
// kTf32 operands must be TF32-rounded where they are stored (as_operand), since the mma truncates
// whatever bits it ignores; kSplit3 operands are split as they are read. The products themselves
// are mma_steps with these fragments.
//
// The A operands of the state passes (W, K_down, Q_up: Operand<kP>) are stored in bf16 for kTf32
// products (bf16 inputs, as FLA keeps them): a pair is one 32-bit load and widens to TF32 exactly.
//
// Row strides that keep the reads free of bank conflicts: fp32 (a 64-bit access is served per half
// warp) 8 (mod 32) floats for k rows, 4 (mod 32) for m rows and n rows; bf16 8 (mod 64) elements for
// both (ld_rows16 in common/round_up.hpp).
#pragma once

#include <type_traits>

#include <cuda_bf16.h>

#include "core/tensor.hpp"
#include "cuda/common/convert.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/vec4.cuh"

namespace fkt::cuda {

// The element type of the stored A operands of products of precision kP, and its DType.
template <Products kP>
using Operand = std::conditional_t<kP == Products::kTf32, __nv_bfloat16, float>;
template <Products kP>
constexpr DType kOperandDType = kP == Products::kTf32 ? DType::kBF16 : DType::kF32;
static_assert(sizeof(Operand<Products::kTf32>) == operand_bytes(Products::kTf32) &&
                  sizeof(Operand<Products::kSplit3>) == operand_bytes(Products::kSplit3),
              "the workspace is sized by operand_bytes (common/products.hpp)");

// x as a stored operand: TF32-rounded for kTf32, as it is for kSplit3.
template <Products kP>
__device__ __forceinline__ float as_operand(float x) {
  return kP == Products::kTf32 ? __uint_as_float(round_tf32(x)) : x;
}

// Stores x, elements (row, col) and (row, col + 1) of a tile, transposed into t [.., ld] as operands:
// t[col][row] and t[col + 1][row].
template <Products kP>
__device__ __forceinline__ void store_transposed_pair(float* t, int ld, int row, int col, const float2& x) {
  t[col * ld + row] = as_operand<kP>(x.x);
  t[(col + 1) * ld + row] = as_operand<kP>(x.y);
}

// The lane's pair (k0 + 2t, k0 + 2t + 1) of row `row` of a k-rows operand.
template <typename T>
__device__ __forceinline__ float2 k_pair(const T* a, int ld, int row, int k0) {
  return load2(a + row * ld + k0 + 2 * (threadIdx.x % 4));
}

// A fragment of the k-step at k0 from k rows: a at the tile's first row, row stride ld.
template <Products kP, typename T>
__device__ __forceinline__ FragA frag_a_k_rows(const T* a, int ld, int k0) {
  const int g = threadIdx.x % 32 / 4;
  const float2 top = k_pair(a, ld, g, k0), bottom = k_pair(a, ld, g + 8, k0);
  return {{stored_operand<kP>(top.x), stored_operand<kP>(bottom.x), stored_operand<kP>(top.y),
           stored_operand<kP>(bottom.y)}};
}

// A fragment of the k-step at k0 from m rows, interleaved: a at the tile's first column (m) of
// row 0 (k), row stride ld.
template <Products kP, typename T>
__device__ __forceinline__ FragA frag_a_m_rows(const T* a, int ld, int k0) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  const float2 first = load2(a + (k0 + 2 * t) * ld + 2 * g), second = load2(a + (k0 + 2 * t + 1) * ld + 2 * g);
  return {{stored_operand<kP>(first.x), stored_operand<kP>(first.y), stored_operand<kP>(second.x),
           stored_operand<kP>(second.y)}};
}

// B fragment of the k-step at k0 from k rows: b at the 8-column tile's first row (n).
template <Products kP>
__device__ __forceinline__ FragB frag_b_k_rows(const float* b, int ld, int k0) {
  const float2 pair = k_pair(b, ld, threadIdx.x % 32 / 4, k0);
  return {stored_operand<kP>(pair.x), stored_operand<kP>(pair.y)};
}

// B fragment of the k-step at k0 from n rows: b at the 8-column tile's first column of row 0 (k).
template <Products kP, typename T>
__device__ __forceinline__ FragB frag_b_n_rows(const T* b, int ld, int k0) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  return {stored_operand<kP>(to_float(b[(k0 + 2 * t) * ld + g])),
          stored_operand<kP>(to_float(b[(k0 + 2 * t + 1) * ld + g]))};
}

}  // namespace fkt::cuda
