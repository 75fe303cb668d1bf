// B2: one reverse step of the state recurrence. d_state holds the gradient of the state leaving
// the chunk; this adds K_down d_state to d_delta and forms the gradient of the entering state:
// d_state_next = diag(exp(gamma_L)) d_state + s Q_up^T dO - W^T d_delta.
#include "cpu/stages.hpp"

namespace fkt::cpu {

template <typename Real>
void bwd_state(const Problem& p, const ChunkPos& c, Scratch<Real>& s) {
  const int64_t K = p.K, V = p.V, l = c.rows;
  const Real scale = static_cast<Real>(p.scale);
  for (int64_t r = 0; r < l; ++r) {
    Real* ddr = s.d_delta + r * V;
    for (int64_t d = 0; d < K; ++d) {
      const Real kd = s.k_down[r * K + d];
      const Real* dSd = s.d_state + d * V;
      for (int64_t e = 0; e < V; ++e) ddr[e] += kd * dSd[e];
    }
  }
  const Real* gamma_last = s.gamma + (l - 1) * K;
  for (int64_t d = 0; d < K; ++d) {
    Real* out = s.d_state_next + d * V;
    const Real* dSd = s.d_state + d * V;
    const Real decay = std::exp(gamma_last[d]);
    for (int64_t e = 0; e < V; ++e) out[e] = decay * dSd[e];
    for (int64_t r = 0; r < l; ++r) {
      const Real qd = scale * s.q_up[r * K + d];
      const Real wd = s.W[r * K + d];
      const Real* dor = s.d_o + r * V;
      const Real* ddr = s.d_delta + r * V;
      for (int64_t e = 0; e < V; ++e) out[e] += qd * dor[e] - wd * ddr[e];
    }
  }
}

template void bwd_state<float>(const Problem&, const ChunkPos&, Scratch<float>&);
template void bwd_state<double>(const Problem&, const ChunkPos&, Scratch<double>&);

}  // namespace fkt::cpu
