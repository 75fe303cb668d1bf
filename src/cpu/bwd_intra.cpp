// B4: gradients through P = s M_qk and A = diag(beta) M_kk. Rows sum over their columns
// (dq_rows, dk_rows), columns over their rows (dk_cols); dgamma gets + on the row side and - on the
// column side of every exp(gamma_r - gamma_i).
#include "cpu/stages.hpp"

namespace fkt::cpu {

template <typename Real>
void bwd_intra(const Problem& p, const ChunkPos& c, Scratch<Real>& s) {
  const int64_t K = p.K, C = p.chunk, l = c.rows;
  for (int64_t x = 0; x < l * K; ++x) s.dq_rows[x] = s.dk_rows[x] = s.dk_cols[x] = 0;
  for (int64_t r = 0; r < l; ++r) {
    const Real* qr = s.q + r * K;
    const Real* kr = s.k + r * K;
    Real* dq_r = s.dq_rows + r * K;
    Real* dk_r = s.dk_rows + r * K;
    for (int64_t i = 0; i <= r; ++i) {
      const Real* decay = s.decay + (r * C + i) * K;
      const Real* ki = s.k + i * K;
      Real* dk_i = s.dk_cols + i * K;
      const Real dp = s.dP[r * C + i];
      const Real da = i < r ? s.dA[r * C + i] : Real(0);
      const Real da_beta = da * s.beta[r];
      for (int64_t d = 0; d < K; ++d) {
        dq_r[d] += dp * ki[d] * decay[d];
        dk_r[d] += da * ki[d] * decay[d];
        dk_i[d] += (dp * qr[d] + da_beta * kr[d]) * decay[d];
      }
    }
    Real db = 0;
    for (int64_t d = 0; d < K; ++d) db += kr[d] * dk_r[d];
    s.dbeta[r] += db;
    for (int64_t d = 0; d < K; ++d) dk_r[d] *= s.beta[r];
  }
  for (int64_t x = 0; x < l * K; ++x) {
    s.dq[x] += s.dq_rows[x];
    s.dk[x] += s.dk_rows[x] + s.dk_cols[x];
    s.dgamma[x] += s.q[x] * s.dq_rows[x] + s.k[x] * (s.dk_rows[x] - s.dk_cols[x]);
  }
}

template void bwd_intra<float>(const Problem&, const ChunkPos&, Scratch<float>&);
template void bwd_intra<double>(const Problem&, const ChunkPos&, Scratch<double>&);

}  // namespace fkt::cpu
