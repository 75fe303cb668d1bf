// Context-parallel summaries (fkt_cp_forward_summary, fkt_cp_backward_summary) and their fold
// (fkt_cp_fold), kda-math.md section 9:
//  - applying a forward summary, S_out = M S_in + S_ext, gives the final state of running the sequence
//    from S_in (fkt_forward), for every sequence of dense and varlen inputs;
//  - applying a backward summary, dS_in = dM dS_out + dS_ext, gives dh0 of fkt_backward with
//    d_final_state = dS_out;
//  - cutting a sequence into pieces (as ranks do) and folding the pieces' summaries gives the state and
//    the state gradient of the whole sequence.
// Errors are max |got - ref| / max |ref|: float64 <= 1e-12, float32 (also for bf16 inputs) <= 1e-5.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace fkt_test {
namespace {

using ::testing::HasSubstr;

// Forward only, or forward and the backward for dh0 alone.
RunFlags flags(bool backward) {
  RunFlags f;
  f.backward = backward;
  f.only = {"dh0"};
  return f;
}

double bound_for(DT dtype) { return dtype == DT::kF64 ? 1e-12 : 1e-5; }

// Element (n, head, d, e) of a state tensor in its storage layout.
int64_t state_index(const Config& c, int64_t n, int64_t head, int64_t d, int64_t e) {
  return c.state_v_first ? ((n * c.HV + head) * c.V + e) * c.K + d : ((n * c.HV + head) * c.K + d) * c.V + e;
}

fkt_cp_sizes cp_sizes(Instance& in) {
  fkt_inputs x = in.inputs();
  fkt_cp_sizes sizes{};
  EXPECT_EQ(fkt_cp_plan_sizes(&x, &in.opt, &sizes), 0) << fkt_last_error();
  EXPECT_EQ(sizes.backend, FKT_BACKEND_CPU);
  return sizes;
}

Tensor workspace_of(uint64_t bytes) { return bytes ? Tensor(DT::kU8, {static_cast<int64_t>(bytes)}) : Tensor(); }

// The summary [HV, K, V + K] of sequence n (forward or backward).
Tensor summary(Instance& in, int64_t n, bool backward) {
  const Config& c = in.cfg;
  Tensor out(in.state_dtype(), {c.HV, c.K, c.V + c.K});
  const fkt_cp_sizes sizes = cp_sizes(in);
  Tensor workspace =
      workspace_of(backward ? sizes.backward_summary_workspace_bytes : sizes.forward_summary_workspace_bytes);
  fkt_inputs x = in.inputs();
  const int status =
      backward ? fkt_cp_backward_summary(&x, &in.opt, in.dO.raw(), n, out.raw(), workspace.raw(), nullptr)
               : fkt_cp_forward_summary(&x, &in.opt, n, out.raw(), workspace.raw(), nullptr);
  EXPECT_EQ(status, 0) << fkt_last_error();
  return out;
}

// Applies a summary to entry n of a state tensor (storage layout): X[:, :, V:] S + X[:, :, :V]. The
// result is in the storage layout of one state [HV, K, V] / [HV, V, K].
std::vector<double> apply(const Config& c, const Tensor& X, const Tensor& states, int64_t n) {
  const int64_t K = c.K, V = c.V, W = V + K;
  std::vector<double> out(c.HV * K * V);
  for (int64_t h = 0; h < c.HV; ++h) {
    for (int64_t d = 0; d < K; ++d) {
      for (int64_t e = 0; e < V; ++e) {
        double acc = X.get((h * K + d) * W + e);
        for (int64_t f = 0; f < K; ++f) acc += X.get((h * K + d) * W + V + f) * states.get(state_index(c, n, h, f, e));
        out[state_index(c, 0, h, d, e)] = acc;
      }
    }
  }
  return out;
}

// max |got - entry n of ref| / max |entry n of ref|.
double state_error(const Config& c, const std::vector<double>& got, const Tensor& ref, int64_t n) {
  const int64_t each = c.HV * c.K * c.V;
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < each; ++i) {
    diff = std::max(diff, std::fabs(got[i] - ref.get(n * each + i)));
    scale = std::max(scale, std::fabs(ref.get(n * each + i)));
  }
  EXPECT_GT(scale, 0.0) << "the reference state is zero; the comparison is vacuous";
  return std::isnan(diff) ? diff : diff / scale;
}

struct Case {
  std::string name;
  Config cfg;
  bool weak_gates = true;  // see weaken_gates
};

// The test data's gates decay by about e^-0.7 per token, so over a sequence of 100 tokens the entering
// state would be forgotten (M ~ e^-70) and M would go untested. Weak gates keep M of order one:
// precomputed log decays are scaled by 0.02, raw in-kernel gates shifted by -6 (softplus / sigmoid ~ e^-6).
void weaken_gates(Instance& in) {
  for (int64_t i = 0; i < in.g.numel(); ++i) {
    in.g.set(i, in.cfg.gate == Gate::kPrecomputed ? 0.02 * in.g.get(i) : in.g.get(i) - 6.0);
  }
}

// max |M S_in| / max |S_out| over the whole state: how much the entering state still matters (the
// delta rule itself contracts it too, e.g. to ~1e-3 over 70 tokens at K = 5). Required to exceed
// 1000 times the error bound, so that an error of 0.1 % in M would fail the test.
double entering_share(const Config& c, const Tensor& X, const Tensor& states, int64_t n) {
  Tensor M = X;
  for (int64_t h = 0; h < c.HV; ++h) {
    for (int64_t d = 0; d < c.K; ++d) {
      for (int64_t e = 0; e < c.V; ++e) M.set((h * c.K + d) * (c.V + c.K) + e, 0.0);
    }
  }
  const std::vector<double> with = apply(c, M, states, n), all = apply(c, X, states, n);
  double a = 0, b = 0;
  for (size_t i = 0; i < with.size(); ++i) {
    a = std::max(a, std::fabs(with[i]));
    b = std::max(b, std::fabs(all[i]));
  }
  return a / b;
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name << " (" << describe(c.cfg) << ")"; }

std::vector<Case> cases() {
  std::vector<Case> out;
  Config c = realistic_config(100);
  out.push_back({"DenseSoftplusGVA", c});
  c = realistic_config(100), c.B = 1, c.T = 165, c.cu_seqlens = {0, 1, 17, 17, 100, 165}, c.seed = 2;
  c.gate = Gate::kPrecomputed, c.A_log = c.dt_bias = false, c.beta = BetaAct::kPlain, c.l2norm = false;
  out.push_back({"VarlenRaggedPrecomputed", c});
  c = realistic_config(100), c.B = 1, c.T = 130, c.cu_seqlens = {0, 64, 65, 130}, c.chunk = 32, c.state_v_first = true;
  c.gate = Gate::kPrecomputed, c.A_log = c.dt_bias = false, c.l2norm = false, c.seed = 3;
  out.push_back({"VarlenChunk32VFirst", c});
  c.g_mask_p = 0.3, c.seed = 33;  // log decays of -1000 (complete forgetting) and 0 (none)
  out.push_back({"VarlenChunk32VFirstExtremeGates", c, false});
  c = realistic_config(100), c.seed = 34;
  out.push_back({"DenseSoftplusGVAStrongDecay", c, false});
  c = realistic_config(100), c.gate = Gate::kBoundedSigmoid, c.lower_bound = -5, c.safe_gate = true, c.seed = 4;
  c.beta = BetaAct::kTwoSigmoid;
  out.push_back({"SafeGateTwoSigmoid", c});
  c = realistic_config(100), c.K = 5, c.V = 11, c.H = 2, c.HV = 4, c.T = 70, c.seed = 5;
  out.push_back({"OddDimsKLessThanV", c});
  c = realistic_config(100), c.dtype = DT::kF32, c.seed = 6;
  out.push_back({"Float32", c});
  c = realistic_config(100), c.dtype = DT::kBF16, c.fp32_g_beta = true, c.seed = 7, c.state_v_first = true;
  out.push_back({"BFloat16VFirst", c});
  return out;
}

class CpSummaryTest : public ::testing::TestWithParam<Case> {};

// Forward: the summary applied to the entering state gives the final state. Backward: applied to the
// final-state gradient it gives dh0. With weak gates the transition part must matter too.
void check_summaries(const Case& param, bool backward) {
  Config c = param.cfg;
  c.h0 = true;
  (backward ? c.d_final_state : c.final_state) = true;
  Instance in = make_instance(c);
  if (param.weak_gates) weaken_gates(in);
  const Result run = run_backend(in, flags(backward));
  const std::string what = backward ? "backward" : "forward";
  for (int64_t n = 0; n < in.N; ++n) {
    const Tensor X = summary(in, n, backward);
    const Tensor& start = backward ? in.dht : in.h0;
    const double err = state_error(c, apply(c, X, start, n), backward ? run.dh0 : run.final_state, n);
    record_error("cp " + what + " summary " + dt_name(in.state_dtype()), backward ? "dh0" : "final_state", err);
    EXPECT_LE(err, bound_for(in.state_dtype())) << describe(c) << ", " << what << ", sequence " << n;
    const int64_t length = in.cu.empty() ? c.T : c.cu_seqlens[n + 1] - c.cu_seqlens[n];
    if (param.weak_gates && length > 0) {
      EXPECT_GT(entering_share(c, X, start, n), 1e3 * bound_for(in.state_dtype()))
          << what << ", sequence " << n << ": the transition part is negligible, untested";
    }
  }
}

TEST_P(CpSummaryTest, ForwardSummaryMapsAnyEnteringStateToTheFinalState) { check_summaries(GetParam(), false); }

TEST_P(CpSummaryTest, BackwardSummaryMapsTheFinalStateGradientToDh0) { check_summaries(GetParam(), true); }

INSTANTIATE_TEST_SUITE_P(Cases, CpSummaryTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// Folds summaries [R, HV, K, V + K] of pieces first .. first + count - 1 into one state.
Tensor fold(const Instance& in, const Tensor& summaries, int64_t first, int64_t count, int direction) {
  const Config& c = in.cfg;
  Tensor state(in.state_dtype(), c.state_v_first ? std::vector<int64_t>{c.HV, c.V, c.K}
                                                 : std::vector<int64_t>{c.HV, c.K, c.V});
  EXPECT_EQ(fkt_cp_fold(summaries.raw(), first, count, direction, c.state_v_first, state.raw(), nullptr), 0)
      << fkt_last_error();
  return state;
}

// Stacks the summaries of every sequence of `in` into [N, HV, K, V + K].
Tensor gathered(Instance& in, bool backward) {
  const Config& c = in.cfg;
  const int64_t each = c.HV * c.K * (c.V + c.K);
  Tensor out(in.state_dtype(), {in.N, c.HV, c.K, c.V + c.K});
  for (int64_t n = 0; n < in.N; ++n) {
    const Tensor X = summary(in, n, backward);
    for (int64_t i = 0; i < each; ++i) out.set(n * each + i, X.get(i));
  }
  return out;
}

std::vector<double> values_of(const Tensor& t) { return t.values(); }

// A sequence of L tokens cut into pieces (the slices of ranks): the varlen problem with the cuts as
// sequence boundaries holds the same tokens; folding its summaries equals running the whole sequence.
void check_pieces(Config c, const std::vector<int64_t>& cuts) {
  c.B = 1, c.cu_seqlens = cuts, c.h0 = true, c.d_final_state = true;
  Instance pieces = make_instance(c);
  weaken_gates(pieces);
  const int64_t R = pieces.N, L = c.T;
  const double bound = bound_for(pieces.state_dtype());
  const std::string category = std::string("cp fold ") + dt_name(pieces.state_dtype());

  // Forward: the whole sequence from a zero state, and the prefix ending at the last cut.
  const Tensor fwd = gathered(pieces, false);
  auto run_tokens = [&](int64_t t0, int64_t len, bool backward) {
    Instance whole = slice_sequence(pieces, 0, t0, len, 0);
    whole.h0 = Tensor(pieces.state_dtype(), {1, c.HV, c.state_v_first ? c.V : c.K, c.state_v_first ? c.K : c.V});
    for (int64_t i = 0; i < whole.h0.numel(); ++i) whole.h0.set(i, 0.0);  // zero entering state
    whole.dht = Tensor();
    whole.cfg.d_final_state = false;
    return run_backend(whole, flags(backward));
  };
  const Result all = run_tokens(0, L, true);
  double err = state_error(c, values_of(fold(pieces, fwd, 0, R, FKT_CP_FORWARD)), all.final_state, 0);
  record_error(category, "forward", err);
  EXPECT_LE(err, bound) << describe(c) << ": forward fold of all pieces";
  const Result prefix = run_tokens(0, cuts[R - 1], false);
  err = state_error(c, values_of(fold(pieces, fwd, 0, R - 1, FKT_CP_FORWARD)), prefix.final_state, 0);
  record_error(category, "forward", err);
  EXPECT_LE(err, bound) << describe(c) << ": forward fold of all pieces but the last";

  // Backward (the losses hold o of the folded pieces only, d_final_state = 0).
  const Tensor bwd = gathered(pieces, true);
  err = state_error(c, values_of(fold(pieces, bwd, 0, R, FKT_CP_BACKWARD)), all.dh0, 0);
  record_error(category, "backward", err);
  EXPECT_LE(err, bound) << describe(c) << ": backward fold of all pieces";
  const Result suffix = run_tokens(cuts[1], L - cuts[1], true);
  err = state_error(c, values_of(fold(pieces, bwd, 1, R - 1, FKT_CP_BACKWARD)), suffix.dh0, 0);
  record_error(category, "backward", err);
  EXPECT_LE(err, bound) << describe(c) << ": backward fold of all pieces but the first";
}

TEST(CpFold, PiecesOfOneSequenceComposeToTheWholeSequence) {
  Config c = realistic_config(100);
  c.T = 200;
  check_pieces(c, {0, 37, 50, 128, 200});  // cuts inside chunks, a piece shorter than a chunk, an aligned cut
  c.state_v_first = true, c.chunk = 32, c.seed = 9;
  check_pieces(c, {0, 1, 100, 101, 200});  // single-token pieces
  c = realistic_config(100), c.T = 150, c.dtype = DT::kF32, c.seed = 10;
  check_pieces(c, {0, 50, 100, 150});
}

TEST(CpSummary, EmptySequenceIsTheIdentityMap) {
  Config c = realistic_config(100);
  c.B = 1, c.T = 20, c.cu_seqlens = {0, 5, 5, 20};
  Instance in = make_instance(c);
  for (bool backward : {false, true}) {
    const Tensor X = summary(in, 1, backward);
    for (int64_t h = 0; h < c.HV; ++h) {
      for (int64_t d = 0; d < c.K; ++d) {
        for (int64_t e = 0; e < c.V + c.K; ++e) {
          EXPECT_EQ(X.get((h * c.K + d) * (c.V + c.K) + e), e == c.V + d ? 1.0 : 0.0) << "backward " << backward;
        }
      }
    }
  }
}

TEST(CpFold, NoRanksGiveAZeroState) {
  Config c = realistic_config(100);
  Instance in = make_instance(c);
  const Tensor fwd = gathered(in, false);
  for (double x : fold(in, fwd, 1, 0, FKT_CP_FORWARD).values()) EXPECT_EQ(x, 0.0);
}

// Every malformed call names the argument.
std::string error_of(int status) {
  EXPECT_NE(status, 0);
  return fkt_last_error();
}

TEST(CpValidation, BadArgumentsAreNamed) {
  Config c = realistic_config(100);
  c.B = 1, c.T = 20, c.cu_seqlens = {0, 5, 20};
  Instance in = make_instance(c);
  fkt_inputs x = in.inputs();
  const fkt_cp_sizes sizes = cp_sizes(in);
  Tensor ws = workspace_of(sizes.backward_summary_workspace_bytes);
  Tensor good(DT::kF64, {c.HV, c.K, c.V + c.K});
  EXPECT_THAT(error_of(fkt_cp_forward_summary(&x, &in.opt, 2, good.raw(), ws.raw(), nullptr)),
              HasSubstr("sequence: expected an index in [0, N) with N = 2 (len(cu_seqlens) - 1), got 2"));
  EXPECT_THAT(error_of(fkt_cp_forward_summary(&x, &in.opt, -1, good.raw(), ws.raw(), nullptr)),
              HasSubstr("sequence: expected an index in [0, N)"));
  Tensor wrong_shape(DT::kF64, {c.HV, c.K, c.V});
  EXPECT_THAT(error_of(fkt_cp_forward_summary(&x, &in.opt, 0, wrong_shape.raw(), ws.raw(), nullptr)),
              HasSubstr("summary: expected shape [HV, K, V + K] = [2, 16, 24], got [2, 16, 8]"));
  Tensor wrong_dtype(DT::kF32, {c.HV, c.K, c.V + c.K});
  EXPECT_THAT(error_of(fkt_cp_forward_summary(&x, &in.opt, 0, wrong_dtype.raw(), ws.raw(), nullptr)),
              HasSubstr("summary: expected float64 (the state dtype), got float32"));
  Tensor small = workspace_of(sizes.forward_summary_workspace_bytes - 1);
  EXPECT_THAT(error_of(fkt_cp_forward_summary(&x, &in.opt, 0, good.raw(), small.raw(), nullptr)),
              HasSubstr("workspace: expected at least"));
  EXPECT_THAT(error_of(fkt_cp_forward_summary(&x, &in.opt, 0, good.raw(), nullptr, nullptr)),
              HasSubstr("workspace: expected a uint8 buffer of"));
  EXPECT_THAT(error_of(fkt_cp_backward_summary(&x, &in.opt, nullptr, 0, good.raw(), ws.raw(), nullptr)),
              HasSubstr("d_o: the gradient of o is required"));
  Tensor bad_do(DT::kF64, {1, 19, c.HV, c.V});
  EXPECT_THAT(error_of(fkt_cp_backward_summary(&x, &in.opt, bad_do.raw(), 0, good.raw(), ws.raw(), nullptr)),
              HasSubstr("d_o: expected the shape of o [1, 20, 2, 8], got [1, 19, 2, 8]"));
  Config dense = realistic_config(100);
  Instance cuda_in = make_instance(dense);
  for (Tensor* t : {&cuda_in.q, &cuda_in.k, &cuda_in.v, &cuda_in.g, &cuda_in.beta, &cuda_in.A_log, &cuda_in.dt_bias,
                    &cuda_in.h0}) {
    t->set_device(FKT_DEVICE_CUDA);
  }
  fkt_inputs cx = cuda_in.inputs();
  fkt_cp_sizes unused{};
  if (!fkt_has_cuda()) {
    EXPECT_THAT(error_of(fkt_cp_plan_sizes(&cx, &cuda_in.opt, &unused)),
                HasSubstr("q: the tensors are on a CUDA device, but this build of flash_kda_train has no CUDA "
                          "backend"));
  }

  // The fold.
  Tensor sums(DT::kF64, {3, c.HV, c.K, c.V + c.K});
  for (int64_t i = 0; i < sums.numel(); ++i) sums.set(i, 0.0);
  Tensor state(DT::kF64, {c.HV, c.K, c.V});
  EXPECT_THAT(error_of(fkt_cp_fold(sums.raw(), 2, 2, FKT_CP_FORWARD, 0, state.raw(), nullptr)),
              HasSubstr("first, count: expected 0 <= first and first + count <= R = 3"));
  EXPECT_THAT(error_of(fkt_cp_fold(sums.raw(), 0, 1, 7, 0, state.raw(), nullptr)),
              HasSubstr("direction: expected FKT_CP_FORWARD (0) or FKT_CP_BACKWARD (1), got 7"));
  EXPECT_THAT(error_of(fkt_cp_fold(sums.raw(), 0, 1, FKT_CP_FORWARD, 1, state.raw(), nullptr)),
              HasSubstr("state: expected shape [HV, V, K] = [2, 8, 16], got [2, 16, 8]"));
  Tensor f32_state(DT::kF32, {c.HV, c.K, c.V});
  EXPECT_THAT(error_of(fkt_cp_fold(sums.raw(), 0, 1, FKT_CP_FORWARD, 0, f32_state.raw(), nullptr)),
              HasSubstr("state: expected the dtype of the summaries (float64), got float32"));
  Tensor flat(DT::kF64, {3, c.HV, c.K, c.K});
  EXPECT_THAT(error_of(fkt_cp_fold(flat.raw(), 0, 1, FKT_CP_FORWARD, 0, state.raw(), nullptr)),
              HasSubstr("summaries: expected shape [R, HV, K, V + K] with V >= 1"));
  EXPECT_EQ(fkt_cp_fold(sums.raw(), 0, 3, FKT_CP_BACKWARD, 0, state.raw(), nullptr), 0) << fkt_last_error();

  // The fold on CUDA (device tags only: every check below fires before anything touches memory).
  sums.set_device(FKT_DEVICE_CUDA, 0);
  EXPECT_THAT(error_of(fkt_cp_fold(sums.raw(), 0, 1, FKT_CP_FORWARD, 0, state.raw(), nullptr)),
              HasSubstr("state: expected a tensor on cuda:0 (the device of the summaries), got one on cpu"));
  state.set_device(FKT_DEVICE_CUDA, 0);
  EXPECT_THAT(error_of(fkt_cp_fold(sums.raw(), 0, 1, FKT_CP_FORWARD, 0, state.raw(), nullptr)),
              HasSubstr("summaries: the CUDA fold reads float32 summaries (the state dtype of the CUDA backend), got "
                        "float64"));
  Tensor f32_sums(DT::kF32, {3, c.HV, c.K, c.V + c.K});
  f32_sums.set_device(FKT_DEVICE_CUDA, 0);
  f32_state.set_device(FKT_DEVICE_CUDA, 0);
  if (!fkt_has_cuda()) {
    EXPECT_THAT(error_of(fkt_cp_fold(f32_sums.raw(), 0, 1, FKT_CP_FORWARD, 0, f32_state.raw(), nullptr)),
                HasSubstr("summaries: the tensors are on a CUDA device, but this build of flash_kda_train has no CUDA "
                          "backend (nvcc was not found when it was built), so the context-parallel fold cannot run"));
  }
  Tensor wide(DT::kF32, {3, c.HV, 200, 208});
  wide.set_device(FKT_DEVICE_CUDA, 0);
  Tensor wide_state(DT::kF32, {c.HV, 200, 8});
  wide_state.set_device(FKT_DEVICE_CUDA, 0);
  if (fkt_has_cuda()) {
    EXPECT_THAT(error_of(fkt_cp_fold(wide.raw(), 0, 1, FKT_CP_FORWARD, 0, wide_state.raw(), nullptr)),
                HasSubstr("summaries: the CUDA fold supports the summaries of the CUDA backend, K, V <= 128"));
  }
}

}  // namespace
}  // namespace fkt_test
