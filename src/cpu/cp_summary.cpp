// Context-parallel summaries of one sequence (kda-math.md section 9), built from the ordinary stages.
//
// Over one chunk the state map is affine: S' = (Diag(exp(Gamma_L)) - K_down^T W) S + K_down^T U, and
// the gradient map of B2 is dS = (Diag(exp(Gamma_L)) - W^T K_down) dS' + (s Q_up^T - W^T P^T) dO.
// So the summary is the state pass itself run on a widened state of V + K columns:
//   forward:  [S | M] from [0 | I] with new values [U | 0]    -> [S_ext | M]  (F4: fwd_state_*)
//   backward: [dS | dM] from [0 | I] with upstream [dO | 0]   -> [dS_ext | dM] (B1 + B2: bwd_dp, bwd_state)
// The M columns see exactly the products of the contract (later chunks on the left forward, earlier
// ones on the left backward) and the S columns the ordinary recurrence from zero. Nothing is truncated.
// The state-pass stages read only K, V, chunk and scale of the problem, so a copy of the problem with
// V widened to V + K drives them on the widened buffers; F0 to F3 run on the ordinary problem.
#include "cpu/cp_summary.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "cpu/driver.hpp"

namespace fkt::cpu {
namespace {

// One thread's buffers: the ordinary chunk scratch and the same scratch with its state-pass buffers
// (state, U, delta; backward: d_o, dP, d_delta, d_state, d_state_next) widened to V + K columns.
template <typename Real>
struct CpSlot {
  Scratch<Real> s;
  Scratch<Real> wide;

  static CpSlot carve(Carver& m, const Problem& p, bool backward) {
    const int64_t C = p.chunk, K = p.K, W = p.V + p.K;
    CpSlot slot;
    slot.s = Scratch<Real>::carve(m, p, false);
    slot.wide = slot.s;
    slot.wide.delta = m.take<Real>(C * W);
    if (!backward) {
      slot.wide.state = m.take<Real>(K * W);
      slot.wide.U = m.take<Real>(C * W);
      return slot;
    }
    slot.wide.d_o = m.take<Real>(C * W);
    slot.wide.dP = m.take<Real>(C * C);
    slot.wide.d_delta = m.take<Real>(C * W);
    slot.wide.d_state = m.take<Real>(K * W);
    slot.wide.d_state_next = m.take<Real>(K * W);
    return slot;
  }
};

template <typename Real>
uint64_t cp_slot_bytes(const Problem& p, bool backward) {
  Carver measure;
  CpSlot<Real>::carve(measure, p, backward);
  return measure.bytes();
}

int cp_slots(const Problem& p) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(max_threads(), p.HV)));
}

Problem widened(const Problem& p) {
  Problem wide = p;
  wide.V = p.V + p.K;
  return wide;
}

// [0 | I] in a K x (V + K) row-major matrix.
template <typename Real>
void set_zero_identity(Real* X, int64_t K, int64_t V) {
  const int64_t W = V + K;
  std::fill(X, X + K * W, Real(0));
  for (int64_t d = 0; d < K; ++d) X[d * W + V + d] = Real(1);
}

// Runs task(head, slot) for every value head on `slots` threads (heads are independent).
template <typename Task>
void for_each_head(const Problem& p, int slots, Task task) {
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(slots)
#endif
  for (int64_t head = 0; head < p.HV; ++head) task(head, thread_index());
}

template <typename Real>
void forward_summary(const Problem& p, int64_t n, Real* summary, char* workspace) {
  const Problem wide_problem = widened(p);
  const Sequence& seq = p.sequences[n];
  const int64_t K = p.K, V = p.V, W = V + K;
  const uint64_t per_slot = cp_slot_bytes<Real>(p, false);
  for_each_head(p, cp_slots(p), [&](int64_t head, int slot) {
    Carver carver(workspace + slot * per_slot);
    CpSlot<Real> b = CpSlot<Real>::carve(carver, p, false);
    set_zero_identity(b.wide.state, K, V);
    for (int64_t j = 0; j < num_chunks(p, seq); ++j) {
      const ChunkPos c = chunk_pos(p, seq, head, j);
      fwd_chunk_local(p, c, b.s);
      for (int64_t r = 0; r < c.rows; ++r) {
        std::copy(b.s.U + r * V, b.s.U + (r + 1) * V, b.wide.U + r * W);
        std::fill(b.wide.U + r * W + V, b.wide.U + (r + 1) * W, Real(0));
      }
      fwd_state_new_values(wide_problem, c, b.wide);
      fwd_state_advance(wide_problem, c, b.wide);
    }
    std::copy(b.wide.state, b.wide.state + K * W, summary + head * K * W);
  });
}

template <typename Real>
void backward_summary(const Problem& p, const View& d_o, int64_t n, Real* summary, char* workspace) {
  const Problem wide_problem = widened(p);
  const Sequence& seq = p.sequences[n];
  const int64_t K = p.K, V = p.V, W = V + K, C = p.chunk;
  const uint64_t per_slot = cp_slot_bytes<Real>(p, true);
  for_each_head(p, cp_slots(p), [&](int64_t head, int slot) {
    Carver carver(workspace + slot * per_slot);
    CpSlot<Real> b = CpSlot<Real>::carve(carver, p, true);
    Scratch<Real>& x = b.wide;
    set_zero_identity(x.d_state, K, V);
    // B1 with zero new values: d_delta = P^T [dO | 0] and dP = 0 (dP feeds no state gradient; the
    // new values belong to the forward from the true entering state, which the summary must not use).
    std::fill(x.delta, x.delta + C * W, Real(0));
    for (int64_t j = num_chunks(p, seq) - 1; j >= 0; --j) {
      const ChunkPos c = chunk_pos(p, seq, head, j);
      fwd_chunk_local(p, c, b.s);
      for (int64_t r = 0; r < c.rows; ++r) {
        Real* row = x.d_o + r * W;
        for (int64_t e = 0; e < V; ++e) row[e] = d_o.get<Real>(seq.b, c.first + r, head, e);
        std::fill(row + V, row + W, Real(0));
      }
      bwd_dp(wide_problem, c, x);
      bwd_state(wide_problem, c, x);
      std::swap(x.d_state, x.d_state_next);
    }
    std::copy(x.d_state, x.d_state + K * W, summary + head * K * W);
  });
}

template <typename Real>
CpSizes sizes_for(const Problem& p) {
  const uint64_t slots = static_cast<uint64_t>(cp_slots(p));
  return {slots * cp_slot_bytes<Real>(p, false), slots * cp_slot_bytes<Real>(p, true)};
}

}  // namespace

CpSizes cp_plan_sizes(const Problem& p) { return p.fp64 ? sizes_for<double>(p) : sizes_for<float>(p); }

void cp_forward_summary(const Problem& p, int64_t sequence, char* summary, char* workspace) {
  if (p.fp64) forward_summary<double>(p, sequence, reinterpret_cast<double*>(summary), workspace);
  else forward_summary<float>(p, sequence, reinterpret_cast<float*>(summary), workspace);
}

void cp_backward_summary(const Problem& p, const fkt_tensor* d_o, int64_t sequence, char* summary,
                         char* workspace) {
  const View grad(d_o, "d_o");
  if (p.fp64) backward_summary<double>(p, grad, sequence, reinterpret_cast<double*>(summary), workspace);
  else backward_summary<float>(p, grad, sequence, reinterpret_cast<float*>(summary), workspace);
}

template <typename Real>
void cp_fold(const Real* summaries, int64_t HV, int64_t K, int64_t V, int64_t first, int64_t count, bool backward,
             bool state_v_first, Real* state) {
  const int64_t W = V + K;
  // Every column of the state evolves alone: col <- M_r col + ext_r[:, e]. Accumulated in double.
  for (int64_t head = 0; head < HV; ++head) {
    for (int64_t e = 0; e < V; ++e) {
      double col[256], next[256];  // K <= 256 is validated
      std::fill(col, col + K, 0.0);
      for (int64_t step = 0; step < count; ++step) {
        const int64_t r = backward ? first + count - 1 - step : first + step;
        const Real* X = summaries + (r * HV + head) * K * W;
        for (int64_t d = 0; d < K; ++d) {
          const Real* row = X + d * W;
          double acc = static_cast<double>(row[e]);
          for (int64_t f = 0; f < K; ++f) acc += static_cast<double>(row[V + f]) * col[f];
          next[d] = acc;
        }
        std::copy(next, next + K, col);
      }
      for (int64_t d = 0; d < K; ++d) {
        Real* out = state + head * K * V + (state_v_first ? e * K + d : d * V + e);
        *out = static_cast<Real>(col[d]);
      }
    }
  }
}

template void cp_fold<float>(const float*, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool, float*);
template void cp_fold<double>(const double*, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool, double*);

}  // namespace fkt::cpu
