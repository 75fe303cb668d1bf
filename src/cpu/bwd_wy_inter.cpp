// B3: gradients through the inter-chunk paths (Q_up S, K_down^T delta, W S) and the WY
// representation (U = T diag(beta) V, W = T diag(beta) K_up), ending in dA = -tril(T^T tril(dT) T^T).
// S is the state entering the chunk, d_state the gradient of the state leaving it.
#include "cpu/stages.hpp"

namespace fkt::cpu {

template <typename Real>
void bwd_wy_inter(const Problem& p, const ChunkPos& c, Scratch<Real>& s, const Real* S) {
  const int64_t K = p.K, V = p.V, C = p.chunk, l = c.rows;
  const Real scale = static_cast<Real>(p.scale);
  const Real* dS = s.d_state;
  const Real* gamma_last = s.gamma + (l - 1) * K;
  Real* dgamma_last = s.dgamma + (l - 1) * K;

  for (int64_t r = 0; r < l; ++r) {
    for (int64_t d = 0; d < K; ++d) {
      const Real* Sd = S + d * V;
      const Real* dSd = dS + d * V;
      const Real* dor = s.d_o + r * V;
      const Real* delta_r = s.delta + r * V;
      const Real* ddr = s.d_delta + r * V;
      Real do_S = 0, delta_dS = 0, dd_S = 0;
      for (int64_t e = 0; e < V; ++e) {
        do_S += dor[e] * Sd[e];
        delta_dS += delta_r[e] * dSd[e];
        dd_S += ddr[e] * Sd[e];
      }
      const Real g = s.gamma[r * K + d];
      s.dq[r * K + d] = scale * do_S * std::exp(g);
      s.dk[r * K + d] = delta_dS * std::exp(gamma_last[d] - g);
      s.dW[r * K + d] = -dd_S;
    }
  }
  // Y_u = T^T d_delta, Y_w = T^T dW (T is lower triangular).
  for (int64_t i = 0; i < l; ++i) {
    Real* Yu = s.Yu + i * V;
    Real* Yw = s.Yw + i * K;
    for (int64_t e = 0; e < V; ++e) Yu[e] = 0;
    for (int64_t d = 0; d < K; ++d) Yw[d] = 0;
    for (int64_t r = i; r < l; ++r) {
      const Real t = s.Tinv[r * C + i];
      for (int64_t e = 0; e < V; ++e) Yu[e] += t * s.d_delta[r * V + e];
      for (int64_t d = 0; d < K; ++d) Yw[d] += t * s.dW[r * K + d];
    }
  }
  for (int64_t r = 0; r < l; ++r) {
    const Real br = s.beta[r];
    Real db = 0;
    for (int64_t e = 0; e < V; ++e) {
      s.dv[r * V + e] = br * s.Yu[r * V + e];
      db += s.Yu[r * V + e] * s.v[r * V + e];
    }
    for (int64_t d = 0; d < K; ++d) {
      const int64_t x = r * K + d;
      db += s.Yw[x] * s.k_up[x];
      s.dgamma[x] = s.q[x] * s.dq[x] - s.k[x] * s.dk[x] + br * s.k_up[x] * s.Yw[x];
    }
    s.dbeta[r] = db;
  }
  // gamma_L feeds K_down of every row and the state decay: its terms land on the last valid row.
  for (int64_t d = 0; d < K; ++d) {
    Real carry = 0;
    for (int64_t e = 0; e < V; ++e) carry += S[d * V + e] * dS[d * V + e];
    Real acc = std::exp(gamma_last[d]) * carry;
    for (int64_t r = 0; r < l; ++r) acc += s.k[r * K + d] * s.dk[r * K + d];
    dgamma_last[d] += acc;
  }
  for (int64_t x = 0; x < l * K; ++x) s.dk[x] += s.beta[x / K] * std::exp(s.gamma[x]) * s.Yw[x];
  // dT[r, i] = (d_delta_r . v_i + dW_r . K_up_i) beta_i, strictly lower part only.
  for (int64_t r = 0; r < l; ++r) {
    for (int64_t i = 0; i < r; ++i) {
      Real acc = 0;
      for (int64_t e = 0; e < V; ++e) acc += s.d_delta[r * V + e] * s.v[i * V + e];
      for (int64_t d = 0; d < K; ++d) acc += s.dW[r * K + d] * s.k_up[i * K + d];
      s.dT[r * C + i] = acc * s.beta[i];
    }
  }
  // Z = tril(dT) T^T into dA, then dA[r, i] = -sum_{m >= r} T[m, r] Z[m, i] in place (row order keeps
  // every Z row that is still needed intact).
  for (int64_t m = 0; m < l; ++m) {
    for (int64_t i = 0; i < l; ++i) {
      Real acc = 0;
      for (int64_t n = 0; n < m && n <= i; ++n) acc += s.dT[m * C + n] * s.Tinv[i * C + n];
      s.dA[m * C + i] = acc;
    }
  }
  for (int64_t r = 0; r < l; ++r) {
    for (int64_t i = 0; i < l; ++i) {
      Real acc = 0;
      if (i < r) {
        for (int64_t m = r; m < l; ++m) acc += s.Tinv[m * C + r] * s.dA[m * C + i];
      }
      s.dA[r * C + i] = -acc;
    }
  }
}

template void bwd_wy_inter<float>(const Problem&, const ChunkPos&, Scratch<float>&, const float*);
template void bwd_wy_inter<double>(const Problem&, const ChunkPos&, Scratch<double>&, const double*);

}  // namespace fkt::cpu
