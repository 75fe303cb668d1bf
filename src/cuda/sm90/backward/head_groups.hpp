// The backward on groups of heads (docs/design.md, "The backward on head groups"): heads are
// independent, so the backward can run B0 to B8 on one group after the other with one group's
// workspace, which grows with the value heads. A group is a view of the call's tensors: pointers at
// its first head, io_H and io_HV the call's head counts (ForwardParams).
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/problem.hpp"
#include "cuda/common/device_limits.hpp"
#include "cuda/sm90/backward/params.hpp"
#include "cuda/sm90/forward/state_config.hpp"

namespace fkt::cuda {

// Two groups when each still gives the state passes a block for every SM (N sequences x value
// heads x V-tiles), so that they take no more waves than the whole call (at B1_T8192_H96: 2 x 192
// blocks against 384); query/key heads split evenly (GVA groups stay whole). One when the forward's
// workspace is read (keep_forward: laid out for all heads).
inline int backward_head_groups(const Problem& p) {
  if (p.keep_forward || p.H % 2 != 0) return 1;
  const int64_t blocks = p.N * StateConfig::tiles(static_cast<int>(p.V)) * (p.HV / 2);
  return blocks >= device_limits(p.device.device_id).sms ? 2 : 1;
}

// The problem of one of `groups` head groups.
inline Problem head_group_problem(const Problem& p, int groups) {
  Problem part = p;
  part.H = p.H / groups;
  part.HV = p.HV / groups;
  return part;
}

namespace detail {
template <typename T>
T* advance(T* base, int64_t elements, DType dtype) {
  if (base == nullptr) return nullptr;
  using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
  return reinterpret_cast<T*>(reinterpret_cast<Byte*>(base) + elements * dtype_bytes(dtype));
}
}  // namespace detail

// params, made for the group problem `part` of `p`, moved onto group `group`'s heads.
inline BackwardParams head_group_params(BackwardParams params, const Problem& p, const Problem& part, int group) {
  using detail::advance;
  const int64_t h0 = group * part.HV, qk0 = group * part.H, K = p.K, V = p.V;
  ForwardParams& f = params.fwd;
  f.q = advance(f.q, qk0 * K, f.qk_dtype);
  f.k = advance(f.k, qk0 * K, f.qk_dtype);
  f.v = advance(f.v, h0 * V, f.v_dtype);
  f.beta = advance(f.beta, h0, f.beta_dtype);
  f.gate.g = advance(f.gate.g, h0 * K, f.gate.g_dtype);
  f.gate.A_log = advance(f.gate.A_log, h0, f.gate.A_log_dtype);
  f.gate.dt_bias = advance(f.gate.dt_bias, h0 * K, f.gate.dt_bias_dtype);
  f.initial_state = advance(f.initial_state, h0 * K * V, DType::kF32);
  f.io_H = static_cast<int32_t>(p.H);
  f.io_HV = static_cast<int32_t>(p.HV);
  params.d_o = advance(params.d_o, h0 * V, params.d_o_dtype);
  params.d_final_state = advance(params.d_final_state, h0 * K * V, DType::kF32);
  params.dq = advance(params.dq, qk0 * K, f.qk_dtype);
  params.dk = advance(params.dk, qk0 * K, f.qk_dtype);
  params.dv = advance(params.dv, h0 * V, params.dv_dtype);
  params.dg = advance(params.dg, h0 * K, f.gate.g_dtype);
  params.dbeta = advance(params.dbeta, h0, params.dbeta_dtype);
  params.dA_log = advance(params.dA_log, h0, params.dA_log_dtype);
  params.ddt_bias = advance(params.ddt_bias, h0 * K, params.ddt_bias_dtype);
  params.dh0 = advance(params.dh0, h0 * K * V, DType::kF32);
  return params;
}

}  // namespace fkt::cuda
