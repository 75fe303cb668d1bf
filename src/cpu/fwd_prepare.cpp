// F0 and the activation half of F1: load one chunk, l2-normalise q and k, activate g and beta.
#include "cpu/stages.hpp"

namespace fkt::cpu {

template <typename Real>
void fwd_prepare(const Problem& p, const ChunkPos& c, Scratch<Real>& s) {
  const View q(p.q), k(p.k), v(p.v), g(p.g), beta(p.beta), A_log(p.A_log), dt_bias(p.dt_bias);
  const int64_t b = c.seq->b, qk_head = c.head / p.group(), K = p.K, V = p.V;
  const Real rate = A_log.present() ? std::exp(A_log.flat<Real>(c.head)) : Real(1);
  const Real lower = static_cast<Real>(p.lower_bound);
  for (int64_t r = 0; r < c.rows; ++r) {
    const int64_t t = c.first + r;
    Real* qr = s.q + r * K;
    Real* kr = s.k + r * K;
    for (int64_t d = 0; d < K; ++d) {
      qr[d] = q.get<Real>(b, t, qk_head, d);
      kr[d] = k.get<Real>(b, t, qk_head, d);
    }
    if (p.l2norm) {
      const Real rq = l2norm_rstd(qr, K), rk = l2norm_rstd(kr, K);
      for (int64_t d = 0; d < K; ++d) {
        qr[d] *= rq;
        kr[d] *= rk;
      }
    }
    for (int64_t d = 0; d < V; ++d) s.v[r * V + d] = v.get<Real>(b, t, c.head, d);
    for (int64_t d = 0; d < K; ++d) {
      Real x = g.get<Real>(b, t, c.head, d);
      if (p.gate != GateMode::kPrecomputed && dt_bias.present()) x += dt_bias.flat<Real>(c.head * K + d);
      Real a = x;
      if (p.gate == GateMode::kSoftplus) a = -rate * softplus(x);
      if (p.gate == GateMode::kBoundedSigmoid) a = lower * sigmoid(rate * x);
      s.a[r * K + d] = a;
    }
    const Real raw_beta = beta.get<Real>(b, t, c.head);
    s.beta[r] = p.beta_mode == BetaMode::kPlain     ? raw_beta
                : p.beta_mode == BetaMode::kSigmoid ? sigmoid(raw_beta)
                                                    : Real(2) * sigmoid(raw_beta);
  }
}

template void fwd_prepare<float>(const Problem&, const ChunkPos&, Scratch<float>&);
template void fwd_prepare<double>(const Problem&, const ChunkPos&, Scratch<double>&);

}  // namespace fkt::cpu
