// CPU backend behaviours beyond the gold comparison grid: determinism, the per-chunk intermediate
// states, empty sequences, partial gradient requests and the cu_seqlens variants.
#include <gtest/gtest.h>
#include <omp.h>

#include <string>
#include <vector>

#include "test_util.hpp"

namespace fkt_test {
namespace {

Config features_config() {
  Config c;
  c.B = 1, c.T = 165, c.H = 1, c.HV = 2, c.K = 16, c.V = 8, c.chunk = 32, c.dtype = DT::kF32;
  c.cu_seqlens = {0, 1, 17, 17, 100, 165};
  c.gate = Gate::kSoftplus, c.A_log = true, c.dt_bias = true;
  c.beta = BetaAct::kSigmoid, c.l2norm = true;
  return c;
}

void expect_results_bitwise_equal(const Result& a, const Result& b, const std::string& what) {
  const auto na = a.named(), nb = b.named();
  ASSERT_EQ(na.size(), nb.size()) << what;
  for (size_t i = 0; i < na.size(); ++i) {
    EXPECT_EQ(na[i].first, nb[i].first) << what;
    EXPECT_TRUE(bitwise_equal(*na[i].second, *nb[i].second)) << what << ": " << na[i].first << " differs";
  }
}

// (d) Two runs give bitwise identical outputs and gradients (parallel tasks, fixed-order reductions).
TEST(CpuDeterminism, TwoRunsAreBitwiseIdentical) {
  for (DT dt : {DT::kF32, DT::kF64}) {
    Config c = features_config();
    c.dtype = dt;
    c.H = 2, c.HV = 4;  // more tasks than threads
    Instance in = make_instance(c);
    const Result a = run_backend(in), b = run_backend(in);
    expect_results_bitwise_equal(a, b, dt_name(dt));
    EXPECT_FALSE(a.dq.empty());
  }
}

// (e) intermediate_states[b, j] is the state entering chunk j: chunk 0 holds the initial state, and
// chunk j the gold final state of the sequence's first j * C tokens.
class IntermediateStates : public ::testing::TestWithParam<std::tuple<bool, int, DT, bool>> {};

TEST_P(IntermediateStates, EqualGoldOnThePrefix) {
  const auto [varlen, chunk, dt, v_first] = GetParam();
  Config c = features_config();
  c.chunk = chunk, c.dtype = dt, c.state_v_first = v_first;
  if (!varlen) c.cu_seqlens.clear(), c.B = 2, c.T = 130;
  Instance in = make_instance(c);
  RunFlags flags;
  flags.backward = false;
  flags.intermediate = true;
  const Result r = run_backend(in, flags);
  ASSERT_FALSE(r.intermediate.empty());
  const double bound = dt == DT::kF64 ? 1e-10 : dt == DT::kF32 ? 2e-5 : 4e-3;

  struct Seq { int64_t b, t0, len; };
  std::vector<Seq> seqs;
  if (varlen) {
    for (size_t n = 0; n + 1 < c.cu_seqlens.size(); ++n)
      seqs.push_back({0, c.cu_seqlens[n], c.cu_seqlens[n + 1] - c.cu_seqlens[n]});
  } else {
    for (int64_t b = 0; b < c.B; ++b) seqs.push_back({b, 0, c.T});
  }
  const int64_t state = c.HV * c.K * c.V;
  const int64_t NT = r.intermediate.shape()[1];
  int64_t expected_NT = 0, offset = 0;
  for (const Seq& s : seqs) {
    const int64_t n_chunks = (s.len + chunk - 1) / chunk;
    expected_NT = varlen ? expected_NT + n_chunks : n_chunks;
  }
  ASSERT_EQ(NT, expected_NT);
  int checked = 0;
  for (size_t n = 0; n < seqs.size(); ++n) {
    const Seq& s = seqs[n];
    const int64_t n_chunks = (s.len + chunk - 1) / chunk;
    const int64_t row0 = varlen ? offset : 0;
    offset += n_chunks;
    for (int64_t j = 0; j < n_chunks; ++j) {
      const int64_t base = (s.b * NT + row0 + j) * state;
      Tensor got(DT::kF64, {1, c.HV, v_first ? c.V : c.K, v_first ? c.K : c.V});
      for (int64_t i = 0; i < state; ++i) got.set(i, r.intermediate.get(base + i));
      if (j == 0) {
        // The initial state, rounded to the input dtype.
        for (int64_t i = 0; i < state; ++i)
          ASSERT_EQ(got.get(i), round_to(dt, in.h0.get(n * state + i))) << "sequence " << n << " element " << i;
        ++checked;
        continue;
      }
      Instance prefix = slice_sequence(in, s.b, s.t0, j * chunk, static_cast<int64_t>(n));
      const Result gold = run_gold(prefix, false);
      const double err = rel_rms(got, gold.final_state);
      record_error(std::string("intermediate states ") + dt_name(dt), "h", err);
      EXPECT_LE(err, bound) << describe(c) << ": sequence " << n << " chunk " << j;
      ++checked;
    }
  }
  EXPECT_GT(checked, static_cast<int>(seqs.size()));
}

INSTANTIATE_TEST_SUITE_P(
    Grid, IntermediateStates,
    ::testing::Combine(::testing::Bool(), ::testing::Values(32, 64), ::testing::Values(DT::kF64, DT::kF32, DT::kBF16),
                       ::testing::Bool()),
    [](const ::testing::TestParamInfo<std::tuple<bool, int, DT, bool>>& info) {
      return std::string(std::get<0>(info.param) ? "Varlen" : "Dense") + "_C" +
             std::to_string(std::get<1>(info.param)) + "_" + dt_name(std::get<2>(info.param)) +
             (std::get<3>(info.param) ? "_VFirst" : "");
    });

// (f) An empty sequence passes its initial state through unchanged and its final-state gradient
// back to dh0 unchanged (bitwise), in the backend and in the gold.
TEST(CpuEmptySequences, StatePassesThroughExactly) {
  for (DT dt : {DT::kF32, DT::kF64}) {
    for (bool v_first : {false, true}) {
      Config c = features_config();
      c.dtype = dt, c.state_v_first = v_first;
      c.T = 9, c.cu_seqlens = {0, 0, 5, 5, 9, 9};
      Instance in = make_instance(c);
      const Result r = run_backend(in);
      const Result gold = run_gold(in);
      const int64_t state = c.HV * c.K * c.V;
      for (int64_t n : {0, 2, 4}) {
        for (int64_t i = 0; i < state; ++i) {
          const int64_t x = n * state + i;
          ASSERT_EQ(r.final_state.get(x), in.h0.get(x)) << dt_name(dt) << " sequence " << n;
          ASSERT_EQ(r.dh0.get(x), in.dht.get(x)) << dt_name(dt) << " sequence " << n;
          ASSERT_EQ(gold.final_state.get(x), in.h0.get(x)) << dt_name(dt) << " sequence " << n;
          ASSERT_EQ(gold.dh0.get(x), in.dht.get(x)) << dt_name(dt) << " sequence " << n;
        }
      }
      // The non-empty sequences are really processed (their states change).
      for (int64_t n : {1, 3}) EXPECT_NE(r.final_state.get(n * state), in.h0.get(n * state));
      // And the whole result still matches the gold.
      expect_close(r, gold, [](const std::string&, DT t) { return t == DT::kF64 ? 1e-10 : 2e-5; },
                   std::string("cpu vs gold ") + dt_name(dt), describe(c), &in);
    }
  }
}

// Without an initial state and without a final-state gradient an empty sequence has a zero final state.
TEST(CpuEmptySequences, ZeroStateWithoutInitialState) {
  Config c = features_config();
  c.h0 = false, c.d_final_state = false;
  c.T = 9, c.cu_seqlens = {0, 4, 4, 9};
  Instance in = make_instance(c);
  const Result r = run_backend(in);
  const int64_t state = c.HV * c.K * c.V;
  for (int64_t i = 0; i < state; ++i) ASSERT_EQ(r.final_state.get(state + i), 0.0);
  EXPECT_NE(norm(r.final_state), 0.0);
}

// A dense problem with no tokens (T = 0) passes every state through, in the backend and in the gold.
TEST(CpuEmptySequences, NoTokensAtAll) {
  for (bool varlen : {false, true}) {
    Config c = features_config();
    c.T = 0, c.B = varlen ? 1 : 2;
    c.cu_seqlens = varlen ? std::vector<int64_t>{0, 0, 0} : std::vector<int64_t>{};
    Instance in = make_instance(c);
    const Result r = run_backend(in);
    const Result gold = run_gold(in);
    ASSERT_EQ(in.N, 2);
    for (const Tensor* t : {&r.final_state, &gold.final_state})
      for (int64_t i = 0; i < in.h0.numel(); ++i) ASSERT_EQ(t->get(i), in.h0.get(i)) << (varlen ? "varlen" : "dense");
    for (const Tensor* t : {&r.dh0, &gold.dh0})
      for (int64_t i = 0; i < in.dht.numel(); ++i) ASSERT_EQ(t->get(i), in.dht.get(i)) << (varlen ? "varlen" : "dense");
    // No tokens: the parameter gradients are exactly zero.
    for (const Tensor* t : {&r.dA_log, &r.ddt_bias, &gold.dA_log, &gold.ddt_bias})
      for (int64_t i = 0; i < t->numel(); ++i) ASSERT_EQ(t->get(i), 0.0);
  }
}

// Without use_gate_in_kernel, A_log, dt_bias and lower_bound are ignored (kda-math.md 1.3 step 5):
// the results are the bits of a run without them.
TEST(CpuGate, ParametersIgnoredWithoutGateInKernel) {
  Config c = features_config();
  c.gate = Gate::kPrecomputed, c.A_log = c.dt_bias = false;
  Instance plain = make_instance(c);
  Instance extra = plain;
  extra.A_log = Tensor(DT::kF32, {c.HV});
  extra.A_log.assign(std::vector<double>(c.HV, 0.7));
  extra.dt_bias = Tensor(DT::kF32, {c.HV * c.K});
  extra.dt_bias.assign(std::vector<double>(c.HV * c.K, 0.3));
  extra.opt.has_lower_bound = 1, extra.opt.lower_bound = -2.0;
  RunFlags flags;
  flags.only = {"dq", "dk", "dv", "dg", "dbeta", "dh0"};
  const Result a = run_backend(plain, flags), b = run_backend(extra, flags);
  expect_results_bitwise_equal(a, b, "backend");
  const Result ga = run_gold(plain, false);
  fkt_inputs x = extra.inputs();
  Tensor o(DT::kF64, ga.o.shape()), ht(DT::kF64, ga.final_state.shape());
  ASSERT_EQ(fkt_gold_forward(&x, &extra.opt, o.raw(), ht.raw()), 0) << fkt_last_error();
  EXPECT_TRUE(bitwise_equal(o, ga.o));
  EXPECT_TRUE(bitwise_equal(ht, ga.final_state));
}

// A NULL gradient output is not computed; the requested ones are identical to a full run.
TEST(CpuPartialGradients, SubsetsMatchTheFullRun) {
  Config c = features_config();
  Instance in = make_instance(c);
  const Result full = run_backend(in);
  for (const std::vector<std::string>& subset :
       {std::vector<std::string>{"dv"}, {"dq", "dA_log"}, {"dk", "dh0"}, {"dg", "dbeta", "ddt_bias"}}) {
    RunFlags flags;
    flags.only = subset;
    const Result part = run_backend(in, flags);
    size_t grads = 0;
    for (const auto& [name, tensor] : part.named()) {
      if (name == "o" || name == "final_state") continue;
      ++grads;
      EXPECT_TRUE(bitwise_equal(*tensor, *full.find(name))) << name;
    }
    EXPECT_EQ(grads, subset.size());
  }
}

// cu_seqlens as int32 or int64, with or without the host copy cu_seqlens_cpu: identical results.
TEST(CpuVarlen, OffsetDtypesAndHostCopyAgree) {
  Config c = features_config();
  Instance a = make_instance(c);
  const Result ra = run_backend(a);
  c.cu_dtype = DT::kI32;
  Instance b = make_instance(c);
  const Result rb = run_backend(b);
  expect_results_bitwise_equal(ra, rb, "int32 vs int64 cu_seqlens");
  b.pass_cu_seqlens_cpu = true;
  const Result rc = run_backend(b);
  expect_results_bitwise_equal(ra, rc, "with cu_seqlens_cpu");
}

// Packed varlen equals running each sequence alone (dense B = 1) in the backend too.
TEST(CpuVarlen, EqualsSequencesRunSeparately) {
  Config c = features_config();
  c.dtype = DT::kF64;
  Instance in = make_instance(c);
  const Result all = run_backend(in);
  const int64_t state = c.HV * c.K * c.V;
  for (int64_t n = 0; n < in.N; ++n) {
    const int64_t t0 = c.cu_seqlens[n], len = c.cu_seqlens[n + 1] - t0;
    if (len == 0) continue;
    Instance one = slice_sequence(in, 0, t0, len, n);
    const Result r = run_backend(one);
    const int64_t row = c.HV * c.V;
    for (int64_t i = 0; i < r.o.numel(); ++i) ASSERT_NEAR(all.o.get(t0 * row + i), r.o.get(i), 1e-13);
    for (int64_t i = 0; i < r.dv.numel(); ++i) ASSERT_NEAR(all.dv.get(t0 * row + i), r.dv.get(i), 1e-13);
    for (int64_t i = 0; i < state; ++i) {
      ASSERT_NEAR(all.final_state.get(n * state + i), r.final_state.get(i), 1e-13);
      ASSERT_NEAR(all.dh0.get(n * state + i), r.dh0.get(i), 1e-13);
    }
  }
}

// DLPack strides are honoured: inputs passed as strided views (padded rows) give the same bits as
// compact inputs.
TEST(CpuStrides, StridedInputsEqualCompactInputs) {
  Config c = features_config();
  c.cu_seqlens.clear(), c.B = 2, c.T = 40;
  Instance in = make_instance(c);
  const Result compact = run_backend(in);
  Instance strided = in;
  strided.q = padded_view(in.q, 3);
  strided.k = padded_view(in.k, 1);
  strided.v = padded_view(in.v, 2);
  strided.g = padded_view(in.g, 5);
  strided.beta = padded_view(in.beta, 1);
  strided.h0 = padded_view(in.h0, 2);
  strided.dO = padded_view(in.dO, 4);
  strided.dht = padded_view(in.dht, 1);
  const Result r = run_backend(strided);
  expect_results_bitwise_equal(compact, r, "strided inputs");
}

// The result does not depend on the number of threads (independent tasks, fixed-order reductions).
TEST(CpuDeterminism, IndependentOfThreadCount) {
  Config c = features_config();
  c.H = 2, c.HV = 4;
  Instance in = make_instance(c);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const Result one = run_backend(in);
  omp_set_num_threads(3);
  const Result three = run_backend(in);
  omp_set_num_threads(saved);
  expect_results_bitwise_equal(one, three, "1 vs 3 threads");
}

// The planner reports the CPU backend, N and the chunk count.
TEST(CpuPlan, SizesDescribeTheProblem) {
  Config c = features_config();
  Instance in = make_instance(c);
  fkt_inputs x = in.inputs();
  fkt_sizes s{};
  ASSERT_EQ(fkt_plan_sizes(&x, &in.opt, &s), 0) << fkt_last_error();
  EXPECT_EQ(s.backend, FKT_BACKEND_CPU);
  EXPECT_EQ(s.num_sequences, 5);
  EXPECT_EQ(s.num_chunks, 1 + 1 + 0 + 3 + 3);  // lengths 1, 16, 0, 83, 65 with C = 32
  EXPECT_GT(s.backward_workspace_bytes, 0u);
  EXPECT_EQ(s.saved_bytes, 0u);  // nothing passes from the CPU forward to its backward
  EXPECT_EQ(s.saving_forward_workspace_bytes, s.forward_workspace_bytes);
  EXPECT_STREQ(fkt_last_error(), "");
  c.cu_seqlens.clear(), c.B = 2, c.T = 130, c.chunk = 64;
  Instance dense = make_instance(c);
  x = dense.inputs();
  ASSERT_EQ(fkt_plan_sizes(&x, &dense.opt, &s), 0) << fkt_last_error();
  EXPECT_EQ(s.num_sequences, 2);
  EXPECT_EQ(s.num_chunks, 3);
  EXPECT_EQ(s.backward_reads_forward_workspace, 0);
  // The CPU backward always recomputes: disable_recompute keeps no forward workspace there.
  dense.opt.disable_recompute = 1;
  fkt_sizes kept{};
  ASSERT_EQ(fkt_plan_sizes(&x, &dense.opt, &kept), 0) << fkt_last_error();
  EXPECT_EQ(kept.backward_reads_forward_workspace, 0);
  EXPECT_EQ(kept.forward_workspace_bytes, s.forward_workspace_bytes);
}

}  // namespace
}  // namespace fkt_test
