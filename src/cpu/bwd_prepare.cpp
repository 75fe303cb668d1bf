// B5 and the q/k half of B8: sum the per-value-head dq, dk over each GVA group (fixed order), then
// chain through the l2norm: dx = r (dx_hat - (dx_hat . x_hat) x_hat).
#include "cpu/backend.hpp"
#include "cpu/driver.hpp"

namespace fkt::cpu {

template <typename Real>
void bwd_prepare(const Problem& p, const Real* dq_heads, const Real* dk_heads, const fkt_backward_io& io) {
  const View q(p.q), k(p.k), dq(io.dq, "dq"), dk(io.dk, "dk");
  const int64_t K = p.K, G = p.group(), rows = p.B * p.T * p.H;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(num_slots(p))
#endif
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t b = row / (p.T * p.H), t = row / p.H % p.T, head = row % p.H;
    Real x[256], grad[256];  // K <= 256 is validated
    for (int which = 0; which < 2; ++which) {
      const View& in = which == 0 ? q : k;
      const View& out = which == 0 ? dq : dk;
      if (!out.present()) continue;
      const Real* heads = which == 0 ? dq_heads : dk_heads;
      for (int64_t d = 0; d < K; ++d) grad[d] = 0;
      for (int64_t member = 0; member < G; ++member) {
        const Real* src = heads + ((b * p.T + t) * p.HV + head * G + member) * K;
        for (int64_t d = 0; d < K; ++d) grad[d] += src[d];
      }
      if (p.l2norm) {
        for (int64_t d = 0; d < K; ++d) x[d] = in.get<Real>(b, t, head, d);
        const Real rstd = l2norm_rstd(x, K);
        Real dot = 0;
        for (int64_t d = 0; d < K; ++d) dot += grad[d] * x[d] * rstd;
        for (int64_t d = 0; d < K; ++d) grad[d] = rstd * (grad[d] - dot * x[d] * rstd);
      }
      for (int64_t d = 0; d < K; ++d) out.set<Real>(grad[d], b, t, head, d);
    }
  }
}

template void bwd_prepare<float>(const Problem&, const float*, const float*, const fkt_backward_io&);
template void bwd_prepare<double>(const Problem&, const double*, const double*, const fkt_backward_io&);

}  // namespace fkt::cpu
