// F4: new values delta = U - W S from the entering state S, then
// S <- diag(exp(gamma_L)) S + K_down^T delta.
#include "cpu/stages.hpp"

namespace fkt::cpu {

template <typename Real>
void fwd_state_new_values(const Problem& p, const ChunkPos& c, Scratch<Real>& s) {
  const int64_t K = p.K, V = p.V;
  for (int64_t r = 0; r < c.rows; ++r) {
    Real* dr = s.delta + r * V;
    for (int64_t e = 0; e < V; ++e) dr[e] = s.U[r * V + e];
    for (int64_t d = 0; d < K; ++d) {
      const Real w = s.W[r * K + d];
      const Real* Sd = s.state + d * V;
      for (int64_t e = 0; e < V; ++e) dr[e] -= w * Sd[e];
    }
  }
}

template <typename Real>
void fwd_state_advance(const Problem& p, const ChunkPos& c, Scratch<Real>& s) {
  const int64_t K = p.K, V = p.V;
  const Real* gamma_last = s.gamma + (c.rows - 1) * K;
  for (int64_t d = 0; d < K; ++d) {
    Real* Sd = s.state + d * V;
    const Real decay = std::exp(gamma_last[d]);
    for (int64_t e = 0; e < V; ++e) Sd[e] *= decay;
    for (int64_t r = 0; r < c.rows; ++r) {
      const Real kd = s.k_down[r * K + d];
      const Real* dr = s.delta + r * V;
      for (int64_t e = 0; e < V; ++e) Sd[e] += kd * dr[e];
    }
  }
}

template void fwd_state_new_values<float>(const Problem&, const ChunkPos&, Scratch<float>&);
template void fwd_state_new_values<double>(const Problem&, const ChunkPos&, Scratch<double>&);
template void fwd_state_advance<float>(const Problem&, const ChunkPos&, Scratch<float>&);
template void fwd_state_advance<double>(const Problem&, const ChunkPos&, Scratch<double>&);

}  // namespace fkt::cpu
