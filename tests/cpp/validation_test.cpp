// Argument validation: every bad call returns non-zero and fkt_last_error() names the argument, what
// was expected and what was given.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "test_util.hpp"

namespace fkt_test {
namespace {

using ::testing::HasSubstr;

Config valid_config() {
  Config c;
  c.B = 1, c.T = 8, c.H = 2, c.HV = 2, c.K = 4, c.V = 3, c.dtype = DT::kF32, c.chunk = 64;
  return c;
}

Config varlen_config() {
  Config c = valid_config();
  c.cu_seqlens = {0, 3, 8};
  return c;
}

// Runs fkt_plan_sizes and both gold entry points (which share the validation) and returns the message.
std::string planning_error(Instance& in) {
  fkt_inputs x = in.inputs();
  fkt_sizes s{};
  EXPECT_NE(fkt_plan_sizes(&x, &in.opt, &s), 0) << "fkt_plan_sizes accepted " << describe(in.cfg);
  const std::string message = fkt_last_error();
  Tensor o(DT::kF64, {in.cfg.B, in.cfg.T, in.cfg.HV, in.cfg.V});
  EXPECT_NE(fkt_gold_forward(&x, &in.opt, o.raw(), nullptr), 0) << "fkt_gold_forward accepted the call";
  EXPECT_EQ(std::string(fkt_last_error()), message);
  return message;
}

void expect_planning_error(const std::function<void(Instance&)>& mutate, const std::string& expected,
                           Config c = valid_config()) {
  Instance in = make_instance(c);
  mutate(in);
  const std::string message = planning_error(in);
  EXPECT_THAT(message, HasSubstr(expected));
  EXPECT_THAT(message, HasSubstr("src/core/")) << "messages start with file:line";
}

TEST(Validation, ValidCallSucceedsAndClearsTheError) {
  Instance bad = make_instance(valid_config());
  bad.opt.chunk_size = 16;
  planning_error(bad);
  EXPECT_STRNE(fkt_last_error(), "");
  Instance in = make_instance(valid_config());
  fkt_inputs x = in.inputs();
  fkt_sizes s{};
  EXPECT_EQ(fkt_plan_sizes(&x, &in.opt, &s), 0) << fkt_last_error();
  EXPECT_STREQ(fkt_last_error(), "");
  EXPECT_STREQ(fkt_version(), "0.1.0");
}

TEST(Validation, ShapeOfKMustEqualQ) {
  expect_planning_error([](Instance& in) { in.k = Tensor(DT::kF32, {1, 8, 2, 5}); },
                        "k: expected the shape of q [1, 8, 2, 4], got [1, 8, 2, 5]");
}

TEST(Validation, VBatchAndTokensMustMatchQ) {
  expect_planning_error([](Instance& in) { in.v = Tensor(DT::kF32, {2, 8, 2, 3}); },
                        "v: expected the batch and token extents of q [1, 8], got shape [2, 8, 2, 3]");
}

TEST(Validation, GShape) {
  expect_planning_error([](Instance& in) { in.g = Tensor(DT::kF32, {1, 8, 1, 4}); },
                        "g: expected shape [B, T, HV, K] = [1, 8, 2, 4], got [1, 8, 1, 4]");
}

TEST(Validation, BetaShape) {
  expect_planning_error([](Instance& in) { in.beta = Tensor(DT::kF32, {1, 8, 2, 1}); },
                        "beta: expected shape [B, T, HV] = [1, 8, 2], got [1, 8, 2, 1]");
}

TEST(Validation, HVMustBeAMultipleOfH) {
  Config c = valid_config();
  c.H = 2, c.HV = 3;
  expect_planning_error([](Instance&) {}, "v: expected the value head count HV to be a multiple of the query/key "
                                          "head count H (GVA), got HV = 3, H = 2", c);
}

TEST(Validation, KAtMost256) {
  Config c = valid_config();
  c.K = 257;
  expect_planning_error([](Instance&) {}, "q: expected head dim K <= 256, got 257", c);
}

TEST(Validation, UnsupportedDtype) {
  expect_planning_error(
      [](Instance& in) {
        in.q = Tensor(DT::kI32, {1, 8, 2, 4});
        in.k = Tensor(DT::kI32, {1, 8, 2, 4});
      },
      "q: expected bfloat16, float16, float32 or float64, got int32");
}

TEST(Validation, KDtypeMustEqualQDtype) {
  expect_planning_error([](Instance& in) { in.k = Tensor(DT::kF16, {1, 8, 2, 4}); },
                        "k: expected the dtype of q (float32), got float16");
}

TEST(Validation, InitialStateMustBeFloat32) {
  expect_planning_error([](Instance& in) { in.h0 = Tensor(DT::kF64, in.state_shape()); },
                        "initial_state: expected float32");
  expect_planning_error([](Instance& in) { in.h0 = Tensor(DT::kBF16, in.state_shape()); },
                        "got bfloat16");
}

TEST(Validation, InitialStateOfFloat64InputsMustBeFloat64) {
  Config c = valid_config();
  c.dtype = DT::kF64;
  expect_planning_error([](Instance& in) { in.h0 = Tensor(DT::kF32, in.state_shape()); },
                        "initial_state: expected float64", c);
}

TEST(Validation, InitialStateCountMustBeN) {
  expect_planning_error([](Instance& in) { in.h0 = Tensor(DT::kF32, {2, 2, 4, 3}); },
                        "initial_state: expected one state per sequence, N = 1");
  Config c = valid_config();
  c.cu_seqlens = {0, 3, 8};
  expect_planning_error([](Instance& in) { in.h0 = Tensor(DT::kF32, {1, 2, 4, 3}); },
                        "initial_state: expected one state per sequence, N = 2 (len(cu_seqlens) - 1)", c);
}

TEST(Validation, InitialStateLayout) {
  expect_planning_error([](Instance& in) { in.h0 = Tensor(DT::kF32, {1, 2, 3, 4}); },
                        "initial_state: expected shape [N, HV, K, V] (state_v_first=False) = [1, 2, 4, 3], got "
                        "[1, 2, 3, 4]");
  Config c = valid_config();
  c.state_v_first = true;
  expect_planning_error([](Instance& in) { in.h0 = Tensor(DT::kF32, {1, 2, 4, 3}); },
                        "initial_state: expected shape [N, HV, V, K] (state_v_first=True) = [1, 2, 3, 4]", c);
}

void set_cu(Instance& in, std::vector<double> values, DT dt = DT::kI64) {
  in.cu = Tensor(dt, {static_cast<int64_t>(values.size())});
  in.cu.assign(values);
}

TEST(Validation, CuSeqlensMustBeIntegers) {
  expect_planning_error([](Instance& in) { set_cu(in, {0, 3, 8}, DT::kF32); },
                        "cu_seqlens: expected int32 or int64, got float32", varlen_config());
}

TEST(Validation, CuSeqlensMustStartAtZero) {
  expect_planning_error([](Instance& in) { set_cu(in, {1, 3, 8}); }, "cu_seqlens: expected cu_seqlens[0] == 0, got 1",
                        varlen_config());
}

TEST(Validation, CuSeqlensMustNotDecrease) {
  expect_planning_error([](Instance& in) { set_cu(in, {0, 5, 3, 8}); },
                        "cu_seqlens: expected non-decreasing offsets, got cu_seqlens[2] = 3 < cu_seqlens[1] = 5",
                        varlen_config());
}

TEST(Validation, CuSeqlensMustEndAtT) {
  expect_planning_error([](Instance& in) { set_cu(in, {0, 3, 7}); },
                        "cu_seqlens: expected the last offset to equal the token count T = 8, got 7", varlen_config());
}

TEST(Validation, CuSeqlensRequiresBatchOne) {
  Config c = varlen_config();
  c.B = 2;
  expect_planning_error([](Instance&) {}, "cu_seqlens: packed variable-length input requires batch size B == 1, got B = 2",
                        c);
}

TEST(Validation, SafeGateLowerBoundRange) {
  Config c = valid_config();
  c.gate = Gate::kBoundedSigmoid, c.safe_gate = true;
  c.lower_bound = -6;
  expect_planning_error([](Instance&) {}, "lower_bound: expected a value in [-5, 0) with safe_gate=True, got -6", c);
  c.lower_bound = 0;
  expect_planning_error([](Instance&) {}, "lower_bound: expected a value in [-5, 0) with safe_gate=True, got 0", c);
  c.gate = Gate::kSoftplus, c.A_log = true;  // safe_gate with an in-kernel gate needs a lower bound
  expect_planning_error([](Instance&) {}, "lower_bound: required when safe_gate=True and use_gate_in_kernel=True", c);
}

TEST(Validation, GateInKernelNeedsALogOrLowerBound) {
  Config c = valid_config();
  c.gate = Gate::kSoftplus, c.A_log = false, c.dt_bias = true;
  expect_planning_error([](Instance&) {}, "A_log: required when use_gate_in_kernel=True and lower_bound is None", c);
}

TEST(Validation, ChunkSize) {
  expect_planning_error([](Instance& in) { in.opt.chunk_size = 16; }, "chunk_size: must be either 32 or 64, got 16");
}

TEST(Validation, ForwardPieces) {
  const char* expected = "forward_pieces: expected -1 (the planner's choice), 0 or 1 (the whole call at once) or a "
                         "count up to 16, got ";
  expect_planning_error([](Instance& in) { in.opt.forward_pieces = -2; }, std::string(expected) + "-2");
  expect_planning_error([](Instance& in) { in.opt.forward_pieces = 17; }, std::string(expected) + "17");
}

TEST(Validation, AllowNegEigvalNeedsBetaSigmoid) {
  expect_planning_error([](Instance& in) { in.opt.allow_neg_eigval = 1; },
                        "allow_neg_eigval: requires use_beta_sigmoid_in_kernel=True");
}

TEST(Validation, TensorsOnDifferentDevices) {
  expect_planning_error([](Instance& in) { in.k.set_device(FKT_DEVICE_CUDA, 0); },
                        "k: expected a tensor on cpu (the device of q), got one on cuda:0; all tensors must be on "
                        "the same device");
  expect_planning_error([](Instance& in) { in.h0.set_device(FKT_DEVICE_CUDA, 1); },
                        "initial_state: expected a tensor on cpu (the device of q), got one on cuda:1");
  expect_planning_error([](Instance& in) { in.cu.set_device(FKT_DEVICE_CUDA, 0); },
                        "cu_seqlens: expected a tensor on cpu (the device of q), got one on cuda:0", varlen_config());
}

// Output checks happen in fkt_forward / fkt_backward.
struct Buffers {
  fkt_sizes sizes{};
  Tensor o, ht, fwd_ws, bwd_ws, dq, dk, dv, dg, dbeta, dA_log, dh0;
};

Buffers buffers_for(Instance& in) {
  Buffers b;
  fkt_inputs x = in.inputs();
  EXPECT_EQ(fkt_plan_sizes(&x, &in.opt, &b.sizes), 0) << fkt_last_error();
  b.o = Tensor(in.cfg.dtype, {in.cfg.B, in.cfg.T, in.cfg.HV, in.cfg.V});
  b.ht = Tensor(in.state_dtype(), in.state_shape());
  b.fwd_ws = Tensor(DT::kU8, {static_cast<int64_t>(b.sizes.forward_workspace_bytes)});
  b.bwd_ws = Tensor(DT::kU8, {static_cast<int64_t>(b.sizes.backward_workspace_bytes)});
  b.dq = Tensor(in.q.dtype(), in.q.shape());
  b.dk = Tensor(in.k.dtype(), in.k.shape());
  b.dv = Tensor(in.v.dtype(), in.v.shape());
  b.dg = Tensor(in.g.dtype(), in.g.shape());
  b.dbeta = Tensor(in.beta.dtype(), in.beta.shape());
  b.dA_log = Tensor(DT::kF32, {in.cfg.HV});
  b.dh0 = Tensor(in.state_dtype(), in.state_shape());
  return b;
}

int forward(Instance& in, Buffers& b) {
  fkt_inputs x = in.inputs();
  fkt_forward_outputs out{b.o.raw(), b.ht.raw(), nullptr, b.fwd_ws.raw()};
  return fkt_forward(&x, &in.opt, &out, nullptr);
}

int backward(Instance& in, Buffers& b, bool with_dA_log) {
  fkt_inputs x = in.inputs();
  fkt_backward_io io{};
  io.d_o = in.dO.raw();
  io.d_final_state = in.dht.raw();
  io.dq = b.dq.raw();
  io.dk = b.dk.raw();
  io.dv = b.dv.raw();
  io.dg = b.dg.raw();
  io.dbeta = b.dbeta.raw();
  io.dA_log = with_dA_log ? b.dA_log.raw() : nullptr;
  io.dh0 = b.dh0.raw();
  io.workspace = b.bwd_ws.raw();
  return fkt_backward(&x, &in.opt, &io, nullptr);
}

TEST(Validation, NonContiguousOutput) {
  Instance in = make_instance(valid_config());
  Buffers b = buffers_for(in);
  ASSERT_EQ(forward(in, b), 0) << fkt_last_error();
  // o viewed with its last two dimensions swapped in memory: same shape, transposed strides.
  b.o.set_strides({8 * 2 * 3, 2 * 3, 1, 2});
  EXPECT_NE(forward(in, b), 0);
  EXPECT_THAT(fkt_last_error(), HasSubstr("o: expected a contiguous (row-major, dense) output"));
}

TEST(Validation, WorkspaceTooSmall) {
  Instance in = make_instance(valid_config());
  Buffers b = buffers_for(in);
  const uint64_t need = b.sizes.forward_workspace_bytes;
  ASSERT_GT(need, 0u);
  b.fwd_ws = Tensor(DT::kU8, {static_cast<int64_t>(need - 1)});
  EXPECT_NE(forward(in, b), 0);
  EXPECT_THAT(fkt_last_error(), HasSubstr("workspace: expected at least " + std::to_string(need) + " bytes, got " +
                                          std::to_string(need - 1)));
  b = buffers_for(in);
  ASSERT_EQ(forward(in, b), 0) << fkt_last_error();
  const uint64_t bwd_need = b.sizes.backward_workspace_bytes;
  b.bwd_ws = Tensor(DT::kU8, {static_cast<int64_t>(bwd_need / 2)});
  EXPECT_NE(backward(in, b, false), 0);
  EXPECT_THAT(fkt_last_error(), HasSubstr("workspace: expected at least " + std::to_string(bwd_need) + " bytes"));
  b.bwd_ws = Tensor();  // none at all
  EXPECT_NE(backward(in, b, false), 0);
  EXPECT_THAT(fkt_last_error(), HasSubstr("workspace: expected a uint8 buffer of " + std::to_string(bwd_need) +
                                          " bytes, got none"));
}

TEST(Validation, MisalignedWorkspace) {
  Instance in = make_instance(valid_config());
  Buffers b = buffers_for(in);
  const int64_t need = static_cast<int64_t>(b.sizes.forward_workspace_bytes);
  ASSERT_GT(need, 0);
  Tensor storage(DT::kU8, {need + 8});
  fkt_tensor* ws = storage.raw();
  int64_t shape[1] = {need};
  ws->shape = shape;
  ws->byte_offset = 8;  // a view starting 8 bytes into an allocation: not 16-byte aligned
  fkt_inputs x = in.inputs();
  fkt_forward_outputs out{b.o.raw(), b.ht.raw(), nullptr, ws};
  EXPECT_NE(fkt_forward(&x, &in.opt, &out, nullptr), 0);
  EXPECT_THAT(fkt_last_error(), HasSubstr("workspace: expected a buffer aligned to 16 bytes"));
}

TEST(Validation, DALogRequestedWithoutALog) {
  Instance in = make_instance(valid_config());
  Buffers b = buffers_for(in);
  ASSERT_EQ(backward(in, b, false), 0) << fkt_last_error();
  EXPECT_NE(backward(in, b, true), 0);
  EXPECT_THAT(fkt_last_error(), HasSubstr("dA_log: requested, but there is no A_log"));
  // The gold backward applies the same output checks.
  fkt_inputs x = in.inputs();
  fkt_backward_io io{};
  io.d_o = in.dO.raw();
  Tensor dA(DT::kF64, {in.cfg.HV});
  io.dA_log = dA.raw();
  EXPECT_NE(fkt_gold_backward(&x, &in.opt, &io), 0);
  EXPECT_THAT(fkt_last_error(), HasSubstr("dA_log: requested, but there is no A_log"));
}

TEST(Validation, OutputShapeAndDtype) {
  Instance in = make_instance(valid_config());
  Buffers b = buffers_for(in);
  b.o = Tensor(DT::kF32, {1, 8, 2, 4});
  EXPECT_NE(forward(in, b), 0);
  EXPECT_THAT(fkt_last_error(), HasSubstr("o: expected an output of shape [1, 8, 2, 3], got [1, 8, 2, 4]"));
  b = buffers_for(in);
  b.ht = Tensor(DT::kBF16, in.state_shape());
  EXPECT_NE(forward(in, b), 0);
  EXPECT_THAT(fkt_last_error(), HasSubstr("final_state: expected an output of dtype float32, got bfloat16"));
}

}  // namespace
}  // namespace fkt_test
