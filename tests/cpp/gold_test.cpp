// The gold oracle (fkt_gold_forward / fkt_gold_backward) against independent references:
//  * its forward against a naive recurrence written here from kda-math.md sections 2.1-2.3,
//  * a single token worked out by hand,
//  * its backward against central finite differences of its own forward (fp64, tiny shapes).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace fkt_test {
namespace {

// ---------------------------------------------------------------------------------------------------
// A second, deliberately plain forward of the recurrence (kda-math.md 2.1-2.3) on flat arrays.

struct RefOut {
  std::vector<double> o;  // [B, T, HV, V]
  std::vector<double> ht; // state_shape layout
};

RefOut reference_forward(Instance& in) {
  const Config& c = in.cfg;
  const int64_t B = c.B, T = c.T, H = c.H, HV = c.HV, K = c.K, V = c.V, G = HV / H;
  const std::vector<double> q = in.q.values(), k = in.k.values(), v = in.v.values(), g = in.g.values(),
                            beta = in.beta.values();
  const std::vector<double> A_log = in.A_log.empty() ? std::vector<double>() : in.A_log.values();
  const std::vector<double> dt_bias = in.dt_bias.empty() ? std::vector<double>() : in.dt_bias.values();
  const std::vector<double> h0 = in.h0.empty() ? std::vector<double>() : in.h0.values();
  std::vector<std::pair<int64_t, std::pair<int64_t, int64_t>>> seqs;  // (b, [begin, end))
  if (c.cu_seqlens.empty()) {
    for (int64_t b = 0; b < B; ++b) seqs.push_back({b, {0, T}});
  } else {
    for (size_t n = 0; n + 1 < c.cu_seqlens.size(); ++n) seqs.push_back({0, {c.cu_seqlens[n], c.cu_seqlens[n + 1]}});
  }
  const int64_t N = static_cast<int64_t>(seqs.size());
  RefOut out{std::vector<double>(B * T * HV * V, 0.0), std::vector<double>(N * HV * K * V, 0.0)};
  auto state_index = [&](int64_t n, int64_t h, int64_t d, int64_t e) {
    return c.state_v_first ? ((n * HV + h) * V + e) * K + d : ((n * HV + h) * K + d) * V + e;
  };
  for (int64_t n = 0; n < N; ++n) {
    const int64_t b = seqs[n].first;
    for (int64_t h = 0; h < HV; ++h) {
      std::vector<std::vector<double>> S(K, std::vector<double>(V, 0.0));
      if (!h0.empty())
        for (int64_t d = 0; d < K; ++d)
          for (int64_t e = 0; e < V; ++e) S[d][e] = h0[state_index(n, h, d, e)];
      for (int64_t t = seqs[n].second.first; t < seqs[n].second.second; ++t) {
        std::vector<double> qt(K), kt(K), a(K);
        double nq = 0, nk = 0;
        for (int64_t d = 0; d < K; ++d) {
          qt[d] = q[((b * T + t) * H + h / G) * K + d];
          kt[d] = k[((b * T + t) * H + h / G) * K + d];
          nq += qt[d] * qt[d];
          nk += kt[d] * kt[d];
        }
        if (c.l2norm) {
          for (int64_t d = 0; d < K; ++d) {
            qt[d] /= std::sqrt(nq + 1e-6);
            kt[d] /= std::sqrt(nk + 1e-6);
          }
        }
        for (int64_t d = 0; d < K; ++d) {
          const double raw = g[((b * T + t) * HV + h) * K + d];
          const double x = raw + (dt_bias.empty() ? 0.0 : dt_bias[h * K + d]);
          const double rate = A_log.empty() ? 1.0 : std::exp(A_log[h]);
          if (c.gate == Gate::kPrecomputed) a[d] = raw;
          else if (c.gate == Gate::kSoftplus) a[d] = -rate * (x > 20 ? x : std::log1p(std::exp(x)));
          else a[d] = c.lower_bound / (1.0 + std::exp(-rate * x));
        }
        const double braw = beta[(b * T + t) * HV + h];
        const double bt = c.beta == BetaAct::kPlain     ? braw
                          : c.beta == BetaAct::kSigmoid ? 1.0 / (1.0 + std::exp(-braw))
                                                        : 2.0 / (1.0 + std::exp(-braw));
        for (int64_t d = 0; d < K; ++d)
          for (int64_t e = 0; e < V; ++e) S[d][e] *= std::exp(a[d]);
        for (int64_t e = 0; e < V; ++e) {
          double pred = 0;
          for (int64_t d = 0; d < K; ++d) pred += S[d][e] * kt[d];
          const double err = v[((b * T + t) * HV + h) * V + e] - pred;
          for (int64_t d = 0; d < K; ++d) S[d][e] += bt * kt[d] * err;
        }
        for (int64_t e = 0; e < V; ++e) {
          double acc = 0;
          for (int64_t d = 0; d < K; ++d) acc += S[d][e] * qt[d];
          out.o[((b * T + t) * HV + h) * V + e] = in.opt.scale * acc;
        }
      }
      for (int64_t d = 0; d < K; ++d)
        for (int64_t e = 0; e < V; ++e) out.ht[state_index(n, h, d, e)] = S[d][e];
    }
  }
  return out;
}

double rel_rms_vec(const Tensor& x, const std::vector<double>& ref) {
  double diff = 0, base = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    diff += (x.get(i) - ref[i]) * (x.get(i) - ref[i]);
    base += ref[i] * ref[i];
  }
  return base > 0 ? std::sqrt(diff / base) : std::sqrt(diff);
}

// ---------------------------------------------------------------------------------------------------
// Cases shared by the forward-semantics and finite-difference tests (tiny shapes, chunk 32).

struct GoldCase {
  std::string name;
  Config cfg;
};

std::vector<GoldCase> gold_cases() {
  std::vector<GoldCase> cases;
  auto base = [](int64_t B, int64_t T, int64_t H, int64_t HV, int64_t K, int64_t V, uint32_t seed) {
    Config c;
    c.B = B, c.T = T, c.H = H, c.HV = HV, c.K = K, c.V = V, c.chunk = 32, c.seed = seed;
    return c;
  };
  {
    Config c = base(1, 7, 1, 1, 4, 3, 11);
    cases.push_back({"PrecomputedGate", c});
  }
  {
    Config c = base(2, 5, 2, 2, 3, 2, 12);
    c.l2norm = true;
    cases.push_back({"PrecomputedGateDenseB2L2norm", c});
  }
  {
    Config c = base(1, 6, 1, 2, 4, 3, 13);
    c.gate = Gate::kSoftplus, c.A_log = true, c.dt_bias = true;
    cases.push_back({"SoftplusAlogBiasGVA", c});
  }
  {
    Config c = base(1, 6, 2, 2, 4, 3, 14);
    c.gate = Gate::kSoftplus, c.A_log = true, c.beta = BetaAct::kSigmoid;
    cases.push_back({"SoftplusNoBiasBetaSigmoid", c});
  }
  {
    Config c = base(1, 8, 1, 1, 3, 3, 15);
    c.gate = Gate::kBoundedSigmoid, c.A_log = true, c.dt_bias = true, c.beta = BetaAct::kTwoSigmoid;
    cases.push_back({"BoundedSigmoidAlogBiasNegEig", c});
  }
  {
    Config c = base(1, 7, 1, 2, 4, 2, 16);
    c.gate = Gate::kBoundedSigmoid, c.dt_bias = true, c.l2norm = true;
    cases.push_back({"BoundedSigmoidNoAlogL2normGVA", c});
  }
  {
    Config c = base(1, 6, 1, 1, 4, 3, 17);
    c.gate = Gate::kBoundedSigmoid, c.beta = BetaAct::kSigmoid;
    cases.push_back({"BoundedSigmoidNoAlogNoBias", c});
  }
  {
    Config c = base(2, 5, 1, 2, 4, 2, 18);
    c.state_v_first = true, c.gate = Gate::kSoftplus, c.A_log = true;
    cases.push_back({"StateVFirstGVA", c});
  }
  {
    Config c = base(1, 8, 1, 2, 4, 3, 19);
    c.cu_seqlens = {0, 3, 3, 8};
    c.gate = Gate::kSoftplus, c.A_log = true, c.dt_bias = true, c.l2norm = true, c.beta = BetaAct::kSigmoid;
    cases.push_back({"VarlenWithEmptySequence", c});
  }
  {
    Config c = base(1, 8, 2, 2, 3, 4, 20);
    c.cu_seqlens = {0, 3, 3, 8};
    c.state_v_first = true, c.h0 = false;
    cases.push_back({"VarlenNoInitialStateVFirst", c});
  }
  {
    Config c = base(1, 9, 1, 1, 3, 3, 21);
    c.final_state = false, c.d_final_state = false, c.scale = 0.7;
    cases.push_back({"NoFinalStateGradientScale", c});
  }
  {
    Config c = base(1, 6, 1, 1, 4, 3, 22);
    c.gate = Gate::kBoundedSigmoid, c.lower_bound = -5.0, c.safe_gate = true, c.A_log = true;
    c.beta = BetaAct::kTwoSigmoid, c.l2norm = true;
    cases.push_back({"SafeGateLowerBoundMinus5", c});
  }
  return cases;
}

class GoldTest : public ::testing::TestWithParam<GoldCase> {};

// The gold forward equals the naive recurrence written above (both fp64, same association order is
// not assumed, hence a tolerance at rounding level).
TEST_P(GoldTest, ForwardMatchesNaiveRecurrence) {
  Instance in = make_instance(GetParam().cfg);
  const Result gold = run_gold(in, false);
  const RefOut ref = reference_forward(in);
  const double eo = rel_rms_vec(gold.o, ref.o), eh = rel_rms_vec(gold.final_state, ref.ht);
  record_error("gold vs naive fwd", "o", eo);
  record_error("gold vs naive fwd", "final_state", eh);
  EXPECT_LE(eo, 1e-13) << describe(in.cfg);
  EXPECT_LE(eh, 1e-13) << describe(in.cfg);
}

// Loss = sum(o * dO) + sum(final_state * dht); every input element is perturbed by +-h.
TEST_P(GoldTest, BackwardMatchesFiniteDifferences) {
  Instance in = make_instance(GetParam().cfg);
  const Result grads = run_gold(in, true);
  auto loss = [&] {
    const Result r = run_gold(in, false);
    double L = dot(r.o, in.dO);
    if (!in.dht.empty()) L += dot(r.final_state, in.dht);
    return L;
  };
  const double h = 1e-6;
  int checked = 0;
  for (auto& [grad_name, input] : in.differentiable()) {
    const Tensor* grad = grads.find(grad_name);
    ASSERT_NE(grad, nullptr) << grad_name;
    ASSERT_EQ(grad->numel(), input->numel()) << grad_name;
    EXPECT_GT(norm(*grad), 1e-3) << grad_name << " is (nearly) zero: the check would be vacuous";
    double worst = 0;
    for (int64_t i = 0; i < input->numel(); ++i) {
      const double x0 = input->get(i);
      input->set(i, x0 + h);
      const double Lp = loss();
      input->set(i, x0 - h);
      const double Lm = loss();
      input->set(i, x0);
      const double fd = (Lp - Lm) / (2 * h), an = grad->get(i);
      const double diff = std::fabs(fd - an);
      worst = std::max(worst, diff / (1.0 + std::fabs(an)));
      EXPECT_LE(diff, 1e-7 * (1.0 + std::fabs(an)))
          << describe(in.cfg) << ": " << grad_name << "[" << i << "] analytic " << an << " vs FD " << fd;
      ++checked;
    }
    record_error("gold vs FD (abs/(1+|g|))", grad_name, worst);
  }
  EXPECT_GT(checked, 0);
}

INSTANTIATE_TEST_SUITE_P(Gold, GoldTest, ::testing::ValuesIn(gold_cases()),
                         [](const ::testing::TestParamInfo<GoldCase>& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------------

// One token, K = V = 1, worked out by hand: S' = 0.5 * 2 = 1, u = 3 - 1 * 1 = 2,
// S = 1 + 0.5 * 1 * 2 = 2, o = 1.5 * 2 * 2 = 6. With dO = dht = 1 the loss is
// L = (s q + 1) S = 4 S and S = a h (1 - b k^2) + b k v (a = exp(g)), so dq = s S = 3,
// dh0 = 4 a (1 - b k^2) = 1, dv = 4 b k = 2, dbeta = 4 (k v - a h k^2) = 8,
// dk = 4 (b v - 2 a h b k) = 2, dg = a * 4 h (1 - b k^2) = 2.
TEST(GoldHand, SingleTokenByHand) {
  for (DT dt : {DT::kF64, DT::kF32}) {
    Config c;
    c.B = 1, c.T = 1, c.H = 1, c.HV = 1, c.K = 1, c.V = 1, c.dtype = dt, c.scale = 1.5;
    Instance in = make_instance(c);
    in.q.set(0, 2.0);
    in.k.set(0, 1.0);
    in.v.set(0, 3.0);
    in.g.set(0, std::log(0.5));
    in.beta.set(0, 0.5);
    in.h0.set(0, 2.0);
    in.dO.set(0, 1.0);
    in.dht.set(0, 1.0);
    const double tol = dt == DT::kF64 ? 1e-12 : 1e-6;
    const Result gold = run_gold(in);
    const Result lib = run_backend(in);
    for (const Result* r : {&gold, &lib}) {
      const char* who = r == &gold ? "gold" : "backend";
      EXPECT_NEAR(r->o.get(0), 6.0, tol) << who << " " << dt_name(dt);
      EXPECT_NEAR(r->final_state.get(0), 2.0, tol) << who << " " << dt_name(dt);
      EXPECT_NEAR(r->dq.get(0), 3.0, tol) << who << " " << dt_name(dt);
      EXPECT_NEAR(r->dk.get(0), 2.0, tol) << who << " " << dt_name(dt);
      EXPECT_NEAR(r->dv.get(0), 2.0, tol) << who << " " << dt_name(dt);
      EXPECT_NEAR(r->dg.get(0), 2.0, tol) << who << " " << dt_name(dt);
      EXPECT_NEAR(r->dbeta.get(0), 8.0, tol) << who << " " << dt_name(dt);
      EXPECT_NEAR(r->dh0.get(0), 1.0, tol) << who << " " << dt_name(dt);
    }
  }
}

// state_v_first only changes storage: a transposed initial state gives the same o and the transposed
// final state and dh0.
TEST(GoldLayout, StateVFirstIsATranspose) {
  Config c;
  c.B = 2, c.T = 9, c.H = 1, c.HV = 2, c.K = 4, c.V = 3, c.seed = 31;
  c.gate = Gate::kSoftplus, c.A_log = true;
  Instance a = make_instance(c);
  Config cv = c;
  cv.state_v_first = true;
  Instance b = make_instance(cv);
  const int64_t K = c.K, V = c.V, HV = c.HV;
  for (int64_t n = 0; n < a.N; ++n)
    for (int64_t h = 0; h < HV; ++h)
      for (int64_t d = 0; d < K; ++d)
        for (int64_t e = 0; e < V; ++e) {
          b.h0.set(((n * HV + h) * V + e) * K + d, a.h0.get(((n * HV + h) * K + d) * V + e));
          b.dht.set(((n * HV + h) * V + e) * K + d, a.dht.get(((n * HV + h) * K + d) * V + e));
        }
  const Result ra = run_gold(a), rb = run_gold(b);
  for (const char* name : {"o", "dq", "dk", "dv", "dg", "dbeta", "dA_log"})
    EXPECT_TRUE(bitwise_equal(*ra.find(name), *rb.find(name))) << name;
  for (const char* name : {"final_state", "dh0"}) {
    const Tensor& x = *ra.find(name);
    const Tensor& y = *rb.find(name);
    for (int64_t n = 0; n < a.N; ++n)
      for (int64_t h = 0; h < HV; ++h)
        for (int64_t d = 0; d < K; ++d)
          for (int64_t e = 0; e < V; ++e)
            ASSERT_EQ(x.get(((n * HV + h) * K + d) * V + e), y.get(((n * HV + h) * V + e) * K + d)) << name;
  }
}

// Varlen packs independent sequences: each sequence run alone (dense, B = 1) gives the same outputs
// and gradients, except for the parameter gradients, which sum over sequences.
TEST(GoldVarlen, EqualsSequencesRunSeparately) {
  Config c;
  c.B = 1, c.T = 12, c.H = 1, c.HV = 2, c.K = 3, c.V = 2, c.seed = 41;
  c.cu_seqlens = {0, 4, 4, 5, 12};
  c.gate = Gate::kSoftplus, c.A_log = true, c.dt_bias = true, c.l2norm = true;
  Instance in = make_instance(c);
  const Result all = run_gold(in);
  std::vector<double> dA_sum(c.HV, 0.0), dbias_sum(c.HV * c.K, 0.0);
  for (int64_t n = 0; n < in.N; ++n) {
    const int64_t t0 = c.cu_seqlens[n], len = c.cu_seqlens[n + 1] - t0;
    Instance one = slice_sequence(in, 0, t0, len, n);
    if (len == 0) continue;  // covered by the empty-sequence tests of the backend
    const Result r = run_gold(one);
    auto check_rows = [&](const Tensor& whole, const Tensor& part, const char* name) {
      const int64_t row = part.numel() / len;
      for (int64_t i = 0; i < part.numel(); ++i)
        EXPECT_NEAR(whole.get(t0 * row + i), part.get(i), 1e-14 * (1 + std::fabs(part.get(i)))) << name << " seq " << n;
    };
    check_rows(all.o, r.o, "o");
    check_rows(all.dq, r.dq, "dq");
    check_rows(all.dk, r.dk, "dk");
    check_rows(all.dv, r.dv, "dv");
    check_rows(all.dg, r.dg, "dg");
    check_rows(all.dbeta, r.dbeta, "dbeta");
    const int64_t state = c.HV * c.K * c.V;
    for (int64_t i = 0; i < state; ++i) {
      EXPECT_EQ(all.final_state.get(n * state + i), r.final_state.get(i));
      EXPECT_EQ(all.dh0.get(n * state + i), r.dh0.get(i));
    }
    for (int64_t i = 0; i < c.HV; ++i) dA_sum[i] += r.dA_log.get(i);
    for (int64_t i = 0; i < c.HV * c.K; ++i) dbias_sum[i] += r.ddt_bias.get(i);
  }
  for (int64_t i = 0; i < c.HV; ++i) EXPECT_NEAR(all.dA_log.get(i), dA_sum[i], 1e-12);
  for (int64_t i = 0; i < c.HV * c.K; ++i) EXPECT_NEAR(all.ddt_bias.get(i), dbias_sum[i], 1e-12);
}

}  // namespace
}  // namespace fkt_test
