// Shared pieces of the CPU forward and backward drivers: the task grid over (sequence, value head),
// per-thread slots, and state tensors in either storage layout.
#pragma once

#include <algorithm>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu/stages.hpp"

namespace fkt::cpu {

inline int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

inline int thread_index() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

// Bytes of one thread's scratch slot.
template <typename Real>
uint64_t slot_bytes(const Problem& p, bool backward) {
  Carver measure;
  Scratch<Real>::carve(measure, p, backward);
  return measure.bytes();
}

// Backward workspace ahead of the slots: per-value-head dq, dk (summed over GVA groups afterwards)
// and the parameter-gradient partials of every (sequence, value head).
template <typename Real>
struct BackwardGlobals {
  Real* dq_heads;          // [B, T, HV, K]
  Real* dk_heads;          // [B, T, HV, K]
  double* dA_log_parts;    // [N, HV]
  double* ddt_bias_parts;  // [N, HV, K]

  static BackwardGlobals carve(Carver& m, const Problem& p) {
    const int64_t elements = p.B * p.T * p.HV * p.K;
    return {m.take<Real>(elements), m.take<Real>(elements), m.take<double>(p.N * p.HV),
            m.take<double>(p.N * p.HV * p.K)};
  }
};

inline char* buffer_bytes(const fkt_tensor* t, const char* name) {
  return t ? TensorRef(t, name).bytes() : nullptr;
}

inline ChunkPos chunk_pos(const Problem& p, const Sequence& seq, int64_t head, int64_t chunk) {
  const int64_t first = seq.t_begin + chunk * p.chunk;
  return {&seq, head, chunk, first, std::min<int64_t>(p.chunk, seq.t_begin + seq.length - first)};
}

inline int64_t num_chunks(const Problem& p, const Sequence& seq) { return (seq.length + p.chunk - 1) / p.chunk; }

// State [K, V] of (sequence n, value head) from / to a state tensor in its storage layout.
template <typename Real>
void load_state(const Problem& p, const View& t, int64_t n, int64_t head, Real* S) {
  for (int64_t d = 0; d < p.K; ++d) {
    for (int64_t e = 0; e < p.V; ++e) {
      S[d * p.V + e] = t.present() ? (p.state_v_first ? t.get<Real>(n, head, e, d) : t.get<Real>(n, head, d, e))
                                   : Real(0);
    }
  }
}

template <typename Real>
void store_state(const Problem& p, const View& t, int64_t n, int64_t head, const Real* S) {
  if (!t.present()) return;
  for (int64_t d = 0; d < p.K; ++d) {
    for (int64_t e = 0; e < p.V; ++e) {
      if (p.state_v_first) t.set<Real>(S[d * p.V + e], n, head, e, d);
      else t.set<Real>(S[d * p.V + e], n, head, d, e);
    }
  }
}

// Runs task(sequence index, value head, slot) over every (sequence, value head) on `slots` threads.
// Tasks are independent, so the result does not depend on the schedule.
template <typename Task>
void for_each_task(const Problem& p, int slots, Task task) {
  const int64_t tasks = p.N * p.HV;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(slots)
#endif
  for (int64_t i = 0; i < tasks; ++i) task(i / p.HV, i % p.HV, thread_index());
}

}  // namespace fkt::cpu
