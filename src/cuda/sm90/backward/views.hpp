// The backward on parts of a call, one after the other in one part's workspace: groups of heads
// (docs/design.md, "The backward on head groups"), time segments (sm90/segments.hpp) or sequence
// groups (sm90/sequence_groups.hpp). A part is a view of the call's tensors: its pointers start at
// the part's first head, token or sequence, and ForwardParams' io_H, io_HV and io_T keep the
// call's strides (a sequence group, of one batch row as every varlen call, has its own io_T).
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/problem.hpp"
#include "cuda/common/device_limits.hpp"
#include "cuda/sm90/backward/params.hpp"
#include "cuda/sm90/forward/state_config.hpp"
#include "cuda/sm90/segments.hpp"
#include "cuda/sm90/sequence_groups.hpp"

namespace fkt::cuda {

// Heads are independent through the whole backward. Two groups when each still gives the state
// passes a block for every SM (N sequences x value heads x V-tiles), so that they take no more
// waves than the whole call (at 96 value heads of one sequence: 2 x 192 blocks against 384);
// query/key heads split evenly (GVA groups stay whole). One when the forward's workspace is read
// (keep_forward: laid out for all heads).
inline int backward_head_groups(const Problem& p) {
  if (p.keep_forward || p.H % 2 != 0) return 1;
  const int64_t blocks = p.N * StateConfig::tiles(static_cast<int>(p.V)) * (p.HV / 2);
  return blocks >= device_limits(p.device.device_id).sms ? 2 : 1;
}

// How a backward splits its call, decided once per call: time segments (dense), sequence groups
// (varlen) or, when neither splits it, head groups. Time segments keep every block; sequence
// groups take at most a half each, so head groups would only add waves to either.
struct BackwardPlan {
  TimeSegments segments;
  SequenceGroups groups;
  int head_groups = 1;

  bool segmented() const { return segments.count > 1; }
  bool grouped() const { return groups.count() > 1; }
};

inline BackwardPlan backward_plan(const Problem& p) {
  BackwardPlan plan{time_segments(p), sequence_groups(p)};
  if (!plan.segmented() && !plan.grouped()) plan.head_groups = backward_head_groups(p);
  return plan;
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

// params, made for a part of the call p, moved onto that part's view of the call's tensors: q, k
// and their gradients by `qk_rows` rows of K; v, g, beta, dO, their gradients and the forward's
// saved T and P by `rows` (token, value head) rows; the per-head tensors (A_log, dt_bias, the states
// and their gradients) by `heads` value heads.
inline BackwardParams view_params(BackwardParams params, const Problem& p, int64_t qk_rows, int64_t rows,
                                  int64_t heads) {
  using detail::advance;
  const int64_t K = p.K, V = p.V;
  ForwardParams& f = params.fwd;
  f.q = advance(f.q, qk_rows * K, f.qk_dtype);
  f.k = advance(f.k, qk_rows * K, f.qk_dtype);
  f.v = advance(f.v, rows * V, f.v_dtype);
  f.beta = advance(f.beta, rows, f.beta_dtype);
  f.gate.g = advance(f.gate.g, rows * K, f.gate.g_dtype);
  f.gate.A_log = advance(f.gate.A_log, heads, f.gate.A_log_dtype);
  f.gate.dt_bias = advance(f.gate.dt_bias, heads * K, f.gate.dt_bias_dtype);
  f.initial_state = advance(f.initial_state, heads * K * V, DType::kF32);
  if (f.ws.recompute) {  // the forward's saved T and P, rows of the inputs as given
    f.ws.T = advance(f.ws.T, rows * f.chunk, DType::kF32);
    f.ws.P = advance(f.ws.P, rows * f.chunk, f.ws.P_dtype);
  }
  f.io_T = p.T;
  f.io_H = static_cast<int32_t>(p.H);
  f.io_HV = static_cast<int32_t>(p.HV);
  params.d_o = advance(params.d_o, rows * V, params.d_o_dtype);
  params.d_final_state = advance(params.d_final_state, heads * K * V, DType::kF32);
  params.dq = advance(params.dq, qk_rows * K, f.qk_dtype);
  params.dk = advance(params.dk, qk_rows * K, f.qk_dtype);
  params.dv = advance(params.dv, rows * V, params.dv_dtype);
  params.dg = advance(params.dg, rows * K, f.gate.g_dtype);
  params.dbeta = advance(params.dbeta, rows, params.dbeta_dtype);
  params.dA_log = advance(params.dA_log, heads, params.dA_log_dtype);
  params.ddt_bias = advance(params.ddt_bias, heads * K, params.ddt_bias_dtype);
  params.dh0 = advance(params.dh0, heads * K * V, DType::kF32);
  return params;
}

// params, made for the sequence group `part` of a varlen call, moved onto the group's view of the
// call's tensors: the token rows by the group's first token t0, the states by its first sequence n0,
// and the offsets those of the group rebased to t0 (int64, on the device: `offsets`).
inline BackwardParams sequence_group_view(const BackwardParams& params, const Problem& part, int64_t t0, int64_t n0,
                                          const int64_t* offsets) {
  using detail::advance;
  BackwardParams view = view_params(params, part, t0 * part.H, t0 * part.HV, 0);
  const int64_t states = n0 * part.HV * part.K * part.V;
  view.fwd.initial_state = advance(view.fwd.initial_state, states, DType::kF32);
  view.d_final_state = advance(view.d_final_state, states, DType::kF32);
  view.dh0 = advance(view.dh0, states, DType::kF32);
  view.fwd.cu_seqlens = offsets;
  view.fwd.offsets_dtype = DType::kI64;
  return view;
}

}  // namespace fkt::cuda
