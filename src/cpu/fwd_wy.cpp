// F3: W = T diag(beta) K_up, U = T diag(beta) V, and the pre-gated K_up, K_down, Q_up.
#include "cpu/stages.hpp"

namespace fkt::cpu {

template <typename Real>
void fwd_wy(const Problem& p, const ChunkPos& c, Scratch<Real>& s) {
  const int64_t K = p.K, V = p.V, C = p.chunk, l = c.rows;
  const Real* gamma_last = s.gamma + (l - 1) * K;
  for (int64_t r = 0; r < l; ++r) {
    for (int64_t d = 0; d < K; ++d) {
      const Real gr = s.gamma[r * K + d];
      const Real up = std::exp(gr);
      s.k_up[r * K + d] = s.k[r * K + d] * up;
      s.q_up[r * K + d] = s.q[r * K + d] * up;
      s.k_down[r * K + d] = s.k[r * K + d] * std::exp(gamma_last[d] - gr);
    }
  }
  for (int64_t r = 0; r < l; ++r) {
    Real* Wr = s.W + r * K;
    Real* Ur = s.U + r * V;
    for (int64_t d = 0; d < K; ++d) Wr[d] = 0;
    for (int64_t d = 0; d < V; ++d) Ur[d] = 0;
    for (int64_t i = 0; i <= r; ++i) {
      const Real coef = s.Tinv[r * C + i] * s.beta[i];
      for (int64_t d = 0; d < K; ++d) Wr[d] += coef * s.k_up[i * K + d];
      for (int64_t d = 0; d < V; ++d) Ur[d] += coef * s.v[i * V + d];
    }
  }
}

template void fwd_wy<float>(const Problem&, const ChunkPos&, Scratch<float>&);
template void fwd_wy<double>(const Problem&, const ChunkPos&, Scratch<double>&);

}  // namespace fkt::cpu
