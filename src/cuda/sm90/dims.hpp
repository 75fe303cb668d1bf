// The chunk size and head dims that the chunk kernels and the state passes compute with, a template
// argument chosen on the host (sm90/launch.cuh, with_dims): the common shape (C = 64, K = V = 128)
// as compile-time constants, so that shared-memory offsets, row strides and loop bounds fold into
// the instructions (bwd_wy_inter: 1.98 G -> 1.37 G warp instructions at B1_T8192_H96), or the
// call's own values. The params P are ForwardParams (forward/params.hpp).
#pragma once

#include "core/problem.hpp"

namespace fkt::cuda {

struct RuntimeDims {
  template <typename P>
  __host__ __device__ static int chunk(const P& p) {
    return p.chunk;
  }
  template <typename P>
  __host__ __device__ static int k(const P& p) {
    return p.K;
  }
  template <typename P>
  __host__ __device__ static int v(const P& p) {
    return p.V;
  }
};

template <int kChunk, int kK, int kV>
struct FixedDims {
  template <typename P>
  __host__ __device__ static constexpr int chunk(const P&) {
    return kChunk;
  }
  template <typename P>
  __host__ __device__ static constexpr int k(const P&) {
    return kK;
  }
  template <typename P>
  __host__ __device__ static constexpr int v(const P&) {
    return kV;
  }
  static bool matches(const Problem& p) { return p.chunk == kChunk && p.K == kK && p.V == kV; }
};

using CommonDims = FixedDims<64, 128, 128>;

}  // namespace fkt::cuda
