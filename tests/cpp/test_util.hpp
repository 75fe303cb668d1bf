// Test helpers: an owning host tensor with a DLPack view, random KDA problems, runners for the
// library (fkt_forward / fkt_backward) and the gold oracle (fkt_gold_forward / fkt_gold_backward),
// and error measures.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "flash_kda_train/c_api.h"

namespace fkt_test {

enum class DT { kBF16, kF16, kF32, kF64, kI32, kI64, kU8 };

fkt_dtype dlpack_dtype(DT dt);
int dt_bytes(DT dt);
const char* dt_name(DT dt);
bool dt_is_float(DT dt);

// Row-major host tensor that owns its storage. raw() refreshes and returns its fkt_tensor view; the
// view stays valid until the tensor is moved or destroyed. New tensors hold the all-ones bit pattern,
// which is NaN in every float dtype, so any element a producer forgets to write shows up.
class Tensor {
 public:
  Tensor() = default;
  Tensor(DT dtype, std::vector<int64_t> shape);

  bool empty() const { return !present_; }
  DT dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  // The shape the DLPack view presents (differs from the storage shape for strided views).
  const std::vector<int64_t>& logical_shape() const { return view_shape_.empty() ? shape_ : view_shape_; }
  int64_t numel() const;
  size_t bytes() const { return static_cast<size_t>(numel()) * dt_bytes(dtype_); }
  const uint8_t* data() const { return reinterpret_cast<const uint8_t*>(storage_.data()); }
  uint8_t* data() { return reinterpret_cast<uint8_t*>(storage_.data()); }

  // Element i in row-major order, converted to / from double (set rounds to the dtype).
  double get(int64_t i) const;
  void set(int64_t i, double value);
  std::vector<double> values() const;
  void assign(const std::vector<double>& values);

  fkt_tensor* raw();
  const fkt_tensor* raw() const;

  // For validation tests: custom element strides (empty = compact) and device.
  void set_strides(std::vector<int64_t> strides) { strides_ = std::move(strides); }
  // Presents the storage through a different shape (with set_strides: a strided view into it).
  void set_view_shape(std::vector<int64_t> shape) { view_shape_ = std::move(shape); }
  void set_device(int32_t type, int32_t id = 0) { device_ = {type, id}; }

 private:
  bool present_ = false;
  DT dtype_ = DT::kF32;
  std::vector<int64_t> shape_;
  std::vector<int64_t> strides_;
  std::vector<int64_t> view_shape_;
  fkt_device device_{FKT_DEVICE_CPU, 0};
  std::vector<double> storage_;  // 8-byte aligned backing store
  mutable fkt_tensor view_{};
};

// The same values stored with `pad` unused elements after every innermost row, passed as a strided view.
Tensor padded_view(const Tensor& src, int64_t pad);

// Rounds a double to the nearest value of dt (through float for the 16-bit types).
double round_to(DT dt, double x);

enum class Gate { kPrecomputed, kSoftplus, kBoundedSigmoid };
enum class BetaAct { kPlain, kSigmoid, kTwoSigmoid };

struct Config {
  int64_t B = 1, T = 8, H = 1, HV = 1, K = 4, V = 3;
  std::vector<int64_t> cu_seqlens;  // empty: dense
  DT cu_dtype = DT::kI64;
  DT dtype = DT::kF64;              // q, k, v, g, beta and dO
  bool fp32_g_beta = false;         // g and beta in float32 whatever dtype is (FLA's usual mix)
  Gate gate = Gate::kPrecomputed;
  bool A_log = false;               // only with an in-kernel gate
  bool dt_bias = false;             // only with an in-kernel gate
  double lower_bound = -3.0;        // used by Gate::kBoundedSigmoid
  BetaAct beta = BetaAct::kPlain;
  bool l2norm = false;
  bool h0 = true;                   // initial state given
  bool final_state = true;          // final state requested from the library
  bool d_final_state = true;        // a gradient of the final state enters the loss
  bool state_v_first = false;
  bool safe_gate = false;
  bool disable_recompute = false;
  int chunk = 64;
  double scale = 0.0;               // 0: K^-1/2
  // Gate extremes: the raw gate is multiplied by g_std; with probability g_mask_p a precomputed log
  // decay is replaced by -1000 (complete forgetting) or 0 (no decay), half each.
  double g_std = 1.0;
  double g_mask_p = 0.0;
  uint32_t seed = 1;
};

std::string describe(const Config& c);

// The realistic default of the feature tests: GVA, K != V, in-kernel softplus gate with A_log and
// dt_bias, beta logits, l2norm in the op, initial and final state, dense B = 2 with T tokens.
Config realistic_config(int64_t T);

// One random problem: inputs, upstream gradients and options.
struct Instance {
  Config cfg;
  int64_t N = 0;
  Tensor q, k, v, g, beta, A_log, dt_bias, h0, cu, dO, dht;
  fkt_options opt{};
  bool pass_cu_seqlens_cpu = false;  // also pass cu as cu_seqlens_cpu

  DT state_dtype() const { return cfg.dtype == DT::kF64 ? DT::kF64 : DT::kF32; }
  DT param_dtype() const { return cfg.dtype == DT::kF64 ? DT::kF64 : DT::kF32; }
  std::vector<int64_t> state_shape() const;
  // fkt_inputs pointing into this instance (valid while it is not moved).
  fkt_inputs inputs();
  // The differentiable inputs that are present, with the name of their gradient.
  std::vector<std::pair<std::string, Tensor*>> differentiable();
};

// Realistic inputs (see Config): q, k ~ N(0,1) (k rows normalised when the op does not l2-normalise),
// v ~ N(0,1), precomputed g = logsigmoid(N(0,1)), raw gate ~ N(0,1), A_log ~ N(0, 0.5^2),
// dt_bias ~ N(0,1), beta = sigmoid(N(0,1)) or raw logits ~ N(0,1), h0, dO, dht ~ N(0,1).
Instance make_instance(const Config& c);

// Token rows [t0, t0 + len) of batch row b as a dense B = 1 problem with sequence n's initial state.
Instance slice_sequence(Instance& in, int64_t b, int64_t t0, int64_t len, int64_t n);

struct Result {
  Tensor o, final_state, intermediate;
  Tensor dq, dk, dv, dg, dbeta, dA_log, ddt_bias, dh0;
  // Present tensors in a fixed order: o, final_state, dq, dk, dv, dg, dbeta, dA_log, ddt_bias, dh0.
  std::vector<std::pair<std::string, const Tensor*>> named() const;
  const Tensor* find(const std::string& name) const;
};

struct RunFlags {
  bool backward = true;
  bool intermediate = false;
  // Gradients to request; empty = all that exist.
  std::vector<std::string> only;
};

// fkt_plan_sizes + workspace allocation + fkt_forward (+ fkt_backward). Failures are test failures.
Result run_backend(Instance& in, const RunFlags& flags = {});
// fkt_gold_forward (+ fkt_gold_backward). The final state is always requested. Outputs are float64.
Result run_gold(Instance& in, bool backward = true);

double dot(const Tensor& a, const Tensor& b);
double norm(const Tensor& a);
// ||x - ref|| / ||ref|| over the whole tensor (||x - ref|| if ref is zero).
double rel_rms(const Tensor& x, const Tensor& ref);
double max_abs_diff(const Tensor& x, const Tensor& ref);
bool bitwise_equal(const Tensor& a, const Tensor& b);

// Records an error for the end-of-run summary (worst value per category and tensor name).
void record_error(const std::string& category, const std::string& tensor, double value);

// The parameter gradients dA_log and ddt_bias are sums over (b, t[, d]) of per-element terms
// (kda-math.md 4.7) whose signs cancel: their error is the sum of the per-element dg errors, so it is
// measured against the sum of |terms| (the condition of the sum), not against the result. Returns, per
// element of the named gradient, sum |term| computed from the reference dg; an empty tensor otherwise.
Tensor reduction_magnitudes(Instance& in, const Result& ref, const std::string& name);

using BoundFn = std::function<double(const std::string& name, DT dtype)>;

// Expects every tensor of `got` to be within `bound(name, dtype of got)` of the same tensor of `ref`:
// rel RMS ||got - ref|| / ||ref||, or ||got - ref|| / ||reduction_magnitudes|| for dA_log and ddt_bias
// when `in` is given. Reference tensors must be finite and non-zero (no comparison is vacuous).
void expect_close(const Result& got, const Result& ref, const BoundFn& bound, const std::string& category,
                  const std::string& context, Instance* in = nullptr);

}  // namespace fkt_test
