// B7 and the beta half of B8: chain da through the gate activation and dbeta through the beta
// activation, write dv, dbeta, dg of the chunk and accumulate the dA_log / ddt_bias partials.
#include "cpu/stages.hpp"

namespace fkt::cpu {

template <typename Real>
void bwd_gate(const Problem& p, const ChunkPos& c, Scratch<Real>& s, const fkt_backward_io& io,
              ParamGradPartials partials) {
  const View g(p.g), beta(p.beta), A_log(p.A_log), dt_bias(p.dt_bias);
  const View dv(io.dv, "dv"), dbeta(io.dbeta, "dbeta"), dg(io.dg, "dg");
  const int64_t b = c.seq->b, K = p.K, V = p.V, head = c.head;
  const Real rate = A_log.present() ? std::exp(A_log.flat<Real>(head)) : Real(1);
  const Real lower = static_cast<Real>(p.lower_bound);
  for (int64_t r = 0; r < c.rows; ++r) {
    const int64_t t = c.first + r;
    if (dv.present()) {
      for (int64_t e = 0; e < V; ++e) dv.set<Real>(s.dv[r * V + e], b, t, head, e);
    }
    if (dbeta.present()) {
      Real grad = s.dbeta[r];
      if (p.beta_mode != BetaMode::kPlain) {
        const Real sig = sigmoid(beta.get<Real>(b, t, head));
        grad *= (p.beta_mode == BetaMode::kTwoSigmoid ? Real(2) : Real(1)) * sig * (Real(1) - sig);
      }
      dbeta.set<Real>(grad, b, t, head);
    }
    for (int64_t d = 0; d < K; ++d) {
      const Real da = s.da[r * K + d];
      Real dx = da;
      if (p.gate != GateMode::kPrecomputed) {
        Real x = g.get<Real>(b, t, head, d);
        if (dt_bias.present()) x += dt_bias.flat<Real>(head * K + d);
        if (p.gate == GateMode::kSoftplus) {
          dx = -da * rate * (x > Real(20) ? Real(1) : sigmoid(x));
          partials.dA_log[0] += static_cast<double>(da * s.a[r * K + d]);
        } else {
          const Real sig = sigmoid(rate * x);
          dx = da * lower * sig * (Real(1) - sig) * rate;
          partials.dA_log[0] += static_cast<double>(dx * x);
        }
        partials.ddt_bias[d] += static_cast<double>(dx);
      }
      if (dg.present()) dg.set<Real>(dx, b, t, head, d);
    }
  }
}

template void bwd_gate<float>(const Problem&, const ChunkPos&, Scratch<float>&, const fkt_backward_io&,
                              ParamGradPartials);
template void bwd_gate<double>(const Problem&, const ChunkPos&, Scratch<double>&, const fkt_backward_io&,
                               ParamGradPartials);

}  // namespace fkt::cpu
