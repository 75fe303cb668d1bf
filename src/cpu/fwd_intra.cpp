// F2: the decay table exp(gamma_r - gamma_i) (i <= r, exponent <= 0 for non-positive gates, so no
// reference-row split is needed on the CPU), the score matrices P and A, and T = (I + A)^-1 by
// forward substitution.
#include "cpu/stages.hpp"

namespace fkt::cpu {

template <typename Real>
void fwd_intra(const Problem& p, const ChunkPos& c, Scratch<Real>& s) {
  const int64_t K = p.K, C = p.chunk, l = c.rows;
  const Real scale = static_cast<Real>(p.scale);
  for (int64_t r = 0; r < l; ++r) {
    const Real* gr = s.gamma + r * K;
    const Real* qr = s.q + r * K;
    const Real* kr = s.k + r * K;
    for (int64_t i = 0; i <= r; ++i) {
      const Real* gi = s.gamma + i * K;
      const Real* ki = s.k + i * K;
      Real* decay = s.decay + (r * C + i) * K;
      Real qk = 0, kk = 0;
      for (int64_t d = 0; d < K; ++d) {
        decay[d] = std::exp(gr[d] - gi[d]);
        qk += qr[d] * ki[d] * decay[d];
        kk += kr[d] * ki[d] * decay[d];
      }
      s.P[r * C + i] = scale * qk;
      s.A[r * C + i] = i < r ? s.beta[r] * kk : Real(0);
    }
  }
  // Row r of (I + A)^-1 is e_r - sum_{m < r} A[r, m] * row m.
  for (int64_t r = 0; r < l; ++r) {
    Real* Tr = s.Tinv + r * C;
    for (int64_t i = 0; i < l; ++i) Tr[i] = i == r ? Real(1) : Real(0);
    for (int64_t m = 0; m < r; ++m) {
      const Real coef = s.A[r * C + m];
      const Real* Tm = s.Tinv + m * C;
      for (int64_t i = 0; i <= m; ++i) Tr[i] -= coef * Tm[i];
    }
  }
}

template void fwd_intra<float>(const Problem&, const ChunkPos&, Scratch<float>&);
template void fwd_intra<double>(const Problem&, const ChunkPos&, Scratch<double>&);

}  // namespace fkt::cpu
