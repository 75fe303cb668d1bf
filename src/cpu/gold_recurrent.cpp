// The gold oracle: the token-by-token recurrence of kda-math.md section 2 in float64, with its exact
// reverse-mode backward through the recurrence and through the l2norm, gate and beta activations.
// It shares no code with the chunked backend beyond tensor access, so each checks the other.
#include <cmath>
#include <vector>

#include "core/error.hpp"
#include "cpu/backend.hpp"
#include "cpu/tensor_io.hpp"

namespace fkt::cpu {
namespace {

struct TokenInputs {
  std::vector<double> q, k, v, a, beta;  // per token: q, k [K] normalised, v [V], a [K], beta
};

double logistic(double x) { return 0.5 * (1.0 + std::tanh(0.5 * x)); }

// Activated inputs of one (sequence, value head), token-major.
TokenInputs activate(const Problem& p, const Sequence& seq, int64_t head) {
  const View q(p.q), k(p.k), v(p.v), g(p.g), beta(p.beta), A_log(p.A_log), dt_bias(p.dt_bias);
  const int64_t L = seq.length, K = p.K, V = p.V, qk_head = head / p.group();
  TokenInputs x{std::vector<double>(L * K), std::vector<double>(L * K), std::vector<double>(L * V),
                std::vector<double>(L * K), std::vector<double>(L)};
  const double rate = A_log.present() ? std::exp(A_log.flat<double>(head)) : 1.0;
  for (int64_t t = 0; t < L; ++t) {
    const int64_t tt = seq.t_begin + t;
    double sq = 0, sk = 0;
    for (int64_t d = 0; d < K; ++d) {
      x.q[t * K + d] = q.get<double>(seq.b, tt, qk_head, d);
      x.k[t * K + d] = k.get<double>(seq.b, tt, qk_head, d);
      sq += x.q[t * K + d] * x.q[t * K + d];
      sk += x.k[t * K + d] * x.k[t * K + d];
    }
    if (p.l2norm) {
      for (int64_t d = 0; d < K; ++d) {
        x.q[t * K + d] /= std::sqrt(sq + 1e-6);
        x.k[t * K + d] /= std::sqrt(sk + 1e-6);
      }
    }
    for (int64_t e = 0; e < V; ++e) x.v[t * V + e] = v.get<double>(seq.b, tt, head, e);
    for (int64_t d = 0; d < K; ++d) {
      const double raw = g.get<double>(seq.b, tt, head, d);
      const double z = raw + (p.gate != GateMode::kPrecomputed && dt_bias.present() ? dt_bias.flat<double>(head * K + d) : 0.0);
      switch (p.gate) {
        case GateMode::kPrecomputed: x.a[t * K + d] = raw; break;
        case GateMode::kSoftplus: x.a[t * K + d] = -rate * (z > 20.0 ? z : std::log(1.0 + std::exp(z))); break;
        case GateMode::kBoundedSigmoid: x.a[t * K + d] = p.lower_bound * logistic(rate * z); break;
      }
    }
    const double b = beta.get<double>(seq.b, tt, head);
    x.beta[t] = p.beta_mode == BetaMode::kPlain ? b : (p.beta_mode == BetaMode::kSigmoid ? 1.0 : 2.0) * logistic(b);
  }
  return x;
}

double state_at(const Problem& p, const View& t, int64_t n, int64_t head, int64_t d, int64_t e) {
  if (!t.present()) return 0.0;
  return p.state_v_first ? t.get<double>(n, head, e, d) : t.get<double>(n, head, d, e);
}

void set_state(const Problem& p, const View& t, int64_t n, int64_t head, int64_t d, int64_t e, double value) {
  if (!t.present()) return;
  if (p.state_v_first) t.set<double>(value, n, head, e, d);
  else t.set<double>(value, n, head, d, e);
}

// One token step: S <- diag(exp(a)) S, u = v - S^T k, S <- S + beta k u^T. Returns u.
void step(int64_t K, int64_t V, const double* a, const double* k, const double* v, double beta, double* S,
          double* u) {
  for (int64_t d = 0; d < K; ++d) {
    const double alpha = std::exp(a[d]);
    for (int64_t e = 0; e < V; ++e) S[d * V + e] *= alpha;
  }
  for (int64_t e = 0; e < V; ++e) {
    double acc = 0;
    for (int64_t d = 0; d < K; ++d) acc += S[d * V + e] * k[d];
    u[e] = v[e] - acc;
  }
  for (int64_t d = 0; d < K; ++d) {
    for (int64_t e = 0; e < V; ++e) S[d * V + e] += beta * k[d] * u[e];
  }
}

}  // namespace

void gold_forward(const Problem& p, const fkt_tensor* o_raw, const fkt_tensor* ht_raw) {
  const View o(o_raw, "o"), ht(ht_raw, "final_state"), h0(p.initial_state);
  const int64_t K = p.K, V = p.V;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1)
#endif
  for (int64_t task = 0; task < p.N * p.HV; ++task) {
    const int64_t n = task / p.HV, head = task % p.HV;
    const Sequence& seq = p.sequences[n];
    const TokenInputs x = activate(p, seq, head);
    std::vector<double> S(K * V), u(V);
    for (int64_t d = 0; d < K; ++d)
      for (int64_t e = 0; e < V; ++e) S[d * V + e] = state_at(p, h0, n, head, d, e);
    for (int64_t t = 0; t < seq.length; ++t) {
      step(K, V, &x.a[t * K], &x.k[t * K], &x.v[t * V], x.beta[t], S.data(), u.data());
      for (int64_t e = 0; e < V; ++e) {
        double acc = 0;
        for (int64_t d = 0; d < K; ++d) acc += S[d * V + e] * x.q[t * K + d];
        o.set<double>(p.scale * acc, seq.b, seq.t_begin + t, head, e);
      }
    }
    for (int64_t d = 0; d < K; ++d)
      for (int64_t e = 0; e < V; ++e) set_state(p, ht, n, head, d, e, S[d * V + e]);
  }
}

void gold_backward(const Problem& p, const fkt_backward_io& io) {
  const View d_o(io.d_o, "d_o"), d_ht(io.d_final_state, "d_final_state"), h0(p.initial_state);
  const View q(p.q), k(p.k), g(p.g), beta(p.beta), A_log(p.A_log), dt_bias(p.dt_bias);
  const View dq(io.dq, "dq"), dk(io.dk, "dk"), dv(io.dv, "dv"), dg(io.dg, "dg"), dbeta(io.dbeta, "dbeta");
  const View dA_log(io.dA_log, "dA_log"), ddt_bias(io.ddt_bias, "ddt_bias"), dh0(io.dh0, "dh0");
  const int64_t K = p.K, V = p.V, HV = p.HV;
  // Gradients w.r.t. the normalised q, k of every value head, and parameter partials per task.
  std::vector<double> dq_hat(p.B * p.T * HV * K, 0.0), dk_hat(p.B * p.T * HV * K, 0.0);
  std::vector<double> dA_parts(p.N * HV, 0.0), dbias_parts(p.N * HV * K, 0.0);
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1)
#endif
  for (int64_t task = 0; task < p.N * HV; ++task) {
    const int64_t n = task / HV, head = task % HV, L = p.sequences[n].length;
    const Sequence& seq = p.sequences[n];
    const TokenInputs x = activate(p, seq, head);
    // states[t] = state before token t; states[L] = final state
    std::vector<double> states((L + 1) * K * V), u(V), Sp(K * V), St(K * V), dS(K * V), dSp(K * V), du(V);
    for (int64_t d = 0; d < K; ++d)
      for (int64_t e = 0; e < V; ++e) states[d * V + e] = state_at(p, h0, n, head, d, e);
    for (int64_t t = 0; t < L; ++t) {
      std::copy(&states[t * K * V], &states[(t + 1) * K * V], &states[(t + 1) * K * V]);
      step(K, V, &x.a[t * K], &x.k[t * K], &x.v[t * V], x.beta[t], &states[(t + 1) * K * V], u.data());
    }
    for (int64_t d = 0; d < K; ++d)
      for (int64_t e = 0; e < V; ++e) dS[d * V + e] = state_at(p, d_ht, n, head, d, e);
    const double rate = A_log.present() ? std::exp(A_log.flat<double>(head)) : 1.0;
    for (int64_t t = L - 1; t >= 0; --t) {
      const int64_t tt = seq.t_begin + t;
      const double* qt = &x.q[t * K];
      const double* kt = &x.k[t * K];
      const double* S_prev = &states[t * K * V];
      const double* S_t = &states[(t + 1) * K * V];
      std::vector<double> dot(V);
      for (int64_t e = 0; e < V; ++e) dot[e] = d_o.get<double>(seq.b, tt, head, e);
      // o_t = s S_t^T q_t
      const int64_t row = ((seq.b * p.T + tt) * HV + head) * K;
      for (int64_t d = 0; d < K; ++d) {
        double acc = 0;
        for (int64_t e = 0; e < V; ++e) {
          acc += S_t[d * V + e] * dot[e];
          dS[d * V + e] += p.scale * qt[d] * dot[e];
        }
        dq_hat[row + d] = p.scale * acc;
      }
      // S' = diag(alpha) S_prev, u = v - S'^T k, S_t = S' + beta k u^T
      for (int64_t d = 0; d < K; ++d)
        for (int64_t e = 0; e < V; ++e) Sp[d * V + e] = std::exp(x.a[t * K + d]) * S_prev[d * V + e];
      for (int64_t e = 0; e < V; ++e) {
        double acc = 0;
        for (int64_t d = 0; d < K; ++d) acc += Sp[d * V + e] * kt[d];
        u[e] = x.v[t * V + e] - acc;
      }
      double dbeta_act = 0;
      for (int64_t e = 0; e < V; ++e) {
        double kdS = 0;
        for (int64_t d = 0; d < K; ++d) kdS += kt[d] * dS[d * V + e];
        dbeta_act += kdS * u[e];
        du[e] = x.beta[t] * kdS;
      }
      for (int64_t d = 0; d < K; ++d) {
        double dSu = 0, Spdu = 0;
        for (int64_t e = 0; e < V; ++e) {
          dSu += dS[d * V + e] * u[e];
          Spdu += Sp[d * V + e] * du[e];
        }
        dk_hat[row + d] = x.beta[t] * dSu - Spdu;
      }
      if (dv.present())
        for (int64_t e = 0; e < V; ++e) dv.set<double>(du[e], seq.b, tt, head, e);
      for (int64_t d = 0; d < K; ++d)
        for (int64_t e = 0; e < V; ++e) dSp[d * V + e] = dS[d * V + e] - kt[d] * du[e];
      for (int64_t d = 0; d < K; ++d) {
        const double alpha = std::exp(x.a[t * K + d]);
        double dalpha = 0;
        for (int64_t e = 0; e < V; ++e) {
          dalpha += dSp[d * V + e] * S_prev[d * V + e];
          dS[d * V + e] = alpha * dSp[d * V + e];
        }
        const double da = alpha * dalpha;
        // chain through the gate activation
        double dgrad = da;
        if (p.gate != GateMode::kPrecomputed) {
          const double z = g.get<double>(seq.b, tt, head, d) + (dt_bias.present() ? dt_bias.flat<double>(head * K + d) : 0.0);
          if (p.gate == GateMode::kSoftplus) {
            const double dsoftplus = z > 20.0 ? 1.0 : std::exp(z) / (1.0 + std::exp(z));
            dgrad = -rate * dsoftplus * da;
            dA_parts[task] += da * x.a[t * K + d];
          } else {
            const double sg = logistic(rate * z);
            dgrad = p.lower_bound * sg * (1.0 - sg) * rate * da;
            dA_parts[task] += dgrad * z;
          }
          dbias_parts[task * K + d] += dgrad;
        }
        if (dg.present()) dg.set<double>(dgrad, seq.b, tt, head, d);
      }
      if (dbeta.present()) {
        double grad = dbeta_act;
        if (p.beta_mode != BetaMode::kPlain) {
          const double sg = logistic(beta.get<double>(seq.b, tt, head));
          grad *= (p.beta_mode == BetaMode::kTwoSigmoid ? 2.0 : 1.0) * sg * (1.0 - sg);
        }
        dbeta.set<double>(grad, seq.b, tt, head);
      }
    }
    for (int64_t d = 0; d < K; ++d)
      for (int64_t e = 0; e < V; ++e) set_state(p, dh0, n, head, d, e, dS[d * V + e]);
  }
  // GVA sum and the l2norm backward of q and k.
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t t = 0; t < p.T; ++t) {
      for (int64_t h = 0; h < p.H; ++h) {
        for (int which = 0; which < 2; ++which) {
          const View& in = which == 0 ? q : k;
          const View& out = which == 0 ? dq : dk;
          const std::vector<double>& hat = which == 0 ? dq_hat : dk_hat;
          if (!out.present()) continue;
          std::vector<double> grad(K, 0.0), raw(K);
          for (int64_t m = 0; m < p.group(); ++m)
            for (int64_t d = 0; d < K; ++d) grad[d] += hat[((b * p.T + t) * HV + h * p.group() + m) * K + d];
          if (p.l2norm) {
            double ss = 0;
            for (int64_t d = 0; d < K; ++d) {
              raw[d] = in.get<double>(b, t, h, d);
              ss += raw[d] * raw[d];
            }
            const double norm = std::sqrt(ss + 1e-6);
            double proj = 0;
            for (int64_t d = 0; d < K; ++d) proj += grad[d] * raw[d];
            for (int64_t d = 0; d < K; ++d) grad[d] = grad[d] / norm - raw[d] * proj / (norm * norm * norm);
          }
          for (int64_t d = 0; d < K; ++d) out.set<double>(grad[d], b, t, h, d);
        }
      }
    }
  }
  for (int64_t head = 0; head < HV; ++head) {
    double sum = 0;
    for (int64_t n = 0; n < p.N; ++n) sum += dA_parts[n * HV + head];
    if (dA_log.present()) dA_log.set_flat<double>(head, sum);
    for (int64_t d = 0; d < K; ++d) {
      double bias = 0;
      for (int64_t n = 0; n < p.N; ++n) bias += dbias_parts[(n * HV + head) * K + d];
      if (ddt_bias.present()) ddt_bias.set_flat<double>(head * K + d, bias);
    }
  }
}

}  // namespace fkt::cpu
