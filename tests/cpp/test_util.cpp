#include "test_util.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

#include "cpu/tensor_io.hpp"

namespace fkt_test {

using fkt::cpu::bf16_to_float;
using fkt::cpu::float_to_bf16;
using fkt::cpu::float_to_half;
using fkt::cpu::half_to_float;

fkt_dtype dlpack_dtype(DT dt) {
  switch (dt) {
    case DT::kBF16: return {FKT_DTYPE_BFLOAT, 16, 1};
    case DT::kF16: return {FKT_DTYPE_FLOAT, 16, 1};
    case DT::kF32: return {FKT_DTYPE_FLOAT, 32, 1};
    case DT::kF64: return {FKT_DTYPE_FLOAT, 64, 1};
    case DT::kI32: return {FKT_DTYPE_INT, 32, 1};
    case DT::kI64: return {FKT_DTYPE_INT, 64, 1};
    case DT::kU8: return {1, 8, 1};
  }
  return {};
}

int dt_bytes(DT dt) {
  switch (dt) {
    case DT::kBF16:
    case DT::kF16: return 2;
    case DT::kF32:
    case DT::kI32: return 4;
    case DT::kF64:
    case DT::kI64: return 8;
    case DT::kU8: return 1;
  }
  return 0;
}

const char* dt_name(DT dt) {
  switch (dt) {
    case DT::kBF16: return "bf16";
    case DT::kF16: return "fp16";
    case DT::kF32: return "fp32";
    case DT::kF64: return "fp64";
    case DT::kI32: return "int32";
    case DT::kI64: return "int64";
    case DT::kU8: return "uint8";
  }
  return "?";
}

bool dt_is_float(DT dt) { return dt == DT::kBF16 || dt == DT::kF16 || dt == DT::kF32 || dt == DT::kF64; }

double round_to(DT dt, double x) {
  switch (dt) {
    case DT::kBF16: return bf16_to_float(float_to_bf16(static_cast<float>(x)));
    case DT::kF16: return half_to_float(float_to_half(static_cast<float>(x)));
    case DT::kF32: return static_cast<float>(x);
    case DT::kF64: return x;
    case DT::kI32: return static_cast<int32_t>(std::llround(x));
    case DT::kI64: return static_cast<double>(std::llround(x));
    case DT::kU8: return static_cast<uint8_t>(std::llround(x));
  }
  return x;
}

// ---------------------------------------------------------------------------------------------------
// Tensor

Tensor::Tensor(DT dtype, std::vector<int64_t> shape) : present_(true), dtype_(dtype), shape_(std::move(shape)) {
  storage_.resize((bytes() + 7) / 8 + 1);
  std::memset(storage_.data(), 0xFF, storage_.size() * 8);
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t e : shape_) n *= e;
  return n;
}

double Tensor::get(int64_t i) const {
  const uint8_t* at = data() + i * dt_bytes(dtype_);
  switch (dtype_) {
    case DT::kBF16: { uint16_t h; std::memcpy(&h, at, 2); return bf16_to_float(h); }
    case DT::kF16: { uint16_t h; std::memcpy(&h, at, 2); return half_to_float(h); }
    case DT::kF32: { float f; std::memcpy(&f, at, 4); return f; }
    case DT::kF64: { double d; std::memcpy(&d, at, 8); return d; }
    case DT::kI32: { int32_t v; std::memcpy(&v, at, 4); return v; }
    case DT::kI64: { int64_t v; std::memcpy(&v, at, 8); return static_cast<double>(v); }
    case DT::kU8: return *at;
  }
  return 0;
}

void Tensor::set(int64_t i, double value) {
  uint8_t* at = data() + i * dt_bytes(dtype_);
  switch (dtype_) {
    case DT::kBF16: { const uint16_t h = float_to_bf16(static_cast<float>(value)); std::memcpy(at, &h, 2); break; }
    case DT::kF16: { const uint16_t h = float_to_half(static_cast<float>(value)); std::memcpy(at, &h, 2); break; }
    case DT::kF32: { const float f = static_cast<float>(value); std::memcpy(at, &f, 4); break; }
    case DT::kF64: std::memcpy(at, &value, 8); break;
    case DT::kI32: { const int32_t v = static_cast<int32_t>(std::llround(value)); std::memcpy(at, &v, 4); break; }
    case DT::kI64: { const int64_t v = std::llround(value); std::memcpy(at, &v, 8); break; }
    case DT::kU8: *at = static_cast<uint8_t>(std::llround(value)); break;
  }
}

std::vector<double> Tensor::values() const {
  std::vector<double> out(numel());
  for (int64_t i = 0; i < numel(); ++i) out[i] = get(i);
  return out;
}

void Tensor::assign(const std::vector<double>& values) {
  EXPECT_EQ(static_cast<int64_t>(values.size()), numel());
  for (int64_t i = 0; i < numel() && i < static_cast<int64_t>(values.size()); ++i) set(i, values[i]);
}

fkt_tensor* Tensor::raw() {
  return const_cast<fkt_tensor*>(static_cast<const Tensor*>(this)->raw());
}

const fkt_tensor* Tensor::raw() const {
  if (!present_) return nullptr;
  view_.data = const_cast<double*>(storage_.data());
  view_.device = device_;
  const std::vector<int64_t>& shape = view_shape_.empty() ? shape_ : view_shape_;
  view_.ndim = static_cast<int32_t>(shape.size());
  view_.dtype = dlpack_dtype(dtype_);
  view_.shape = const_cast<int64_t*>(shape.data());
  view_.strides = strides_.empty() ? nullptr : const_cast<int64_t*>(strides_.data());
  view_.byte_offset = 0;
  return &view_;
}

Tensor padded_view(const Tensor& src, int64_t pad) {
  std::vector<int64_t> shape = src.shape();
  const int64_t inner = shape.back(), rows = src.numel() / inner;
  shape.back() = inner + pad;
  Tensor out(src.dtype(), shape);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < inner; ++i) out.set(r * (inner + pad) + i, src.get(r * inner + i));
  std::vector<int64_t> strides(shape.size());
  int64_t running = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = running;
    running *= shape[i];
  }
  out.set_view_shape(src.shape());
  out.set_strides(strides);
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Problems

Config realistic_config(int64_t T) {
  Config c;
  c.B = 2, c.T = T, c.H = 1, c.HV = 2, c.K = 16, c.V = 8;
  c.gate = Gate::kSoftplus, c.A_log = true, c.dt_bias = true;
  c.beta = BetaAct::kSigmoid, c.l2norm = true;
  return c;
}

std::string describe(const Config& c) {
  std::ostringstream s;
  s << dt_name(c.dtype) << " B" << c.B << " T" << c.T << " H" << c.H << " HV" << c.HV << " K" << c.K << " V" << c.V
    << " C" << c.chunk;
  if (!c.cu_seqlens.empty()) {
    s << " cu[";
    for (size_t i = 0; i < c.cu_seqlens.size(); ++i) s << (i ? "," : "") << c.cu_seqlens[i];
    s << "]";
  }
  const char* gates[] = {"pre", "softplus", "sigmoid"};
  s << " gate=" << gates[static_cast<int>(c.gate)];
  if (c.gate == Gate::kBoundedSigmoid) s << "(" << c.lower_bound << ")";
  if (c.A_log) s << "+A_log";
  if (c.dt_bias) s << "+dt_bias";
  const char* betas[] = {"plain", "sigmoid", "2sigmoid"};
  s << " beta=" << betas[static_cast<int>(c.beta)];
  if (c.l2norm) s << " l2norm";
  if (c.h0) s << " h0";
  if (c.final_state) s << " ht";
  if (c.d_final_state) s << " dht";
  if (c.state_v_first) s << " vfirst";
  if (c.safe_gate) s << " safe";
  if (c.disable_recompute) s << " norecompute";
  if (c.fp32_g_beta) s << " fp32(g,beta)";
  if (c.scale != 0) s << " scale=" << c.scale;
  if (c.g_std != 1.0) s << " g_std=" << c.g_std;
  if (c.g_mask_p != 0.0) s << " g_mask=" << c.g_mask_p;
  s << " seed=" << c.seed;
  return s.str();
}

std::vector<int64_t> Instance::state_shape() const {
  return cfg.state_v_first ? std::vector<int64_t>{N, cfg.HV, cfg.V, cfg.K}
                           : std::vector<int64_t>{N, cfg.HV, cfg.K, cfg.V};
}

fkt_inputs Instance::inputs() {
  fkt_inputs in{};
  in.q = q.raw();
  in.k = k.raw();
  in.v = v.raw();
  in.g = g.raw();
  in.beta = beta.raw();
  in.A_log = A_log.raw();
  in.dt_bias = dt_bias.raw();
  in.initial_state = h0.raw();
  in.cu_seqlens = cu.raw();
  in.cu_seqlens_cpu = pass_cu_seqlens_cpu ? cu.raw() : nullptr;
  return in;
}

std::vector<std::pair<std::string, Tensor*>> Instance::differentiable() {
  std::vector<std::pair<std::string, Tensor*>> out = {
      {"dq", &q}, {"dk", &k}, {"dv", &v}, {"dg", &g}, {"dbeta", &beta}};
  if (!A_log.empty()) out.push_back({"dA_log", &A_log});
  if (!dt_bias.empty()) out.push_back({"ddt_bias", &dt_bias});
  if (!h0.empty()) out.push_back({"dh0", &h0});
  return out;
}

namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double log_sigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }

}  // namespace

Instance make_instance(const Config& c) {
  Instance in;
  in.cfg = c;
  const bool varlen = !c.cu_seqlens.empty();
  in.N = varlen ? static_cast<int64_t>(c.cu_seqlens.size()) - 1 : c.B;
  std::mt19937 rng(c.seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  auto randn = [&] { return normal(rng); };
  auto fill = [&](Tensor& t, auto gen) {
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, gen());
  };

  in.q = Tensor(c.dtype, {c.B, c.T, c.H, c.K});
  fill(in.q, randn);
  in.k = Tensor(c.dtype, {c.B, c.T, c.H, c.K});
  for (int64_t row = 0; row < c.B * c.T * c.H; ++row) {
    std::vector<double> x(c.K);
    double ss = 0;
    for (double& e : x) {
      e = randn();
      ss += e * e;
    }
    // Without the in-op l2norm the caller normalises k (as FLA's tests do) to keep the state bounded.
    const double scale = c.l2norm ? 1.0 : 1.0 / std::sqrt(ss);
    for (int64_t d = 0; d < c.K; ++d) in.k.set(row * c.K + d, x[d] * scale);
  }
  in.v = Tensor(c.dtype, {c.B, c.T, c.HV, c.V});
  fill(in.v, randn);
  const DT g_beta_dtype = c.fp32_g_beta ? DT::kF32 : c.dtype;
  in.g = Tensor(g_beta_dtype, {c.B, c.T, c.HV, c.K});
  if (c.gate == Gate::kPrecomputed) {
    fill(in.g, [&] {
      double x = log_sigmoid(c.g_std * randn());
      if (c.g_mask_p > 0 && uniform(rng) < c.g_mask_p) x = uniform(rng) < 0.5 ? -1000.0 : 0.0;
      return x;
    });
  } else {
    fill(in.g, [&] { return c.g_std * randn(); });
  }
  in.beta = Tensor(g_beta_dtype, {c.B, c.T, c.HV});
  if (c.beta == BetaAct::kPlain) fill(in.beta, [&] { return sigmoid(randn()); });
  else fill(in.beta, randn);
  if (c.gate != Gate::kPrecomputed && c.A_log) {
    in.A_log = Tensor(in.param_dtype(), {c.HV});
    fill(in.A_log, [&] { return 0.5 * randn(); });
  }
  if (c.gate != Gate::kPrecomputed && c.dt_bias) {
    in.dt_bias = Tensor(in.param_dtype(), {c.HV * c.K});
    fill(in.dt_bias, randn);
  }
  if (c.h0) {
    in.h0 = Tensor(in.state_dtype(), in.state_shape());
    fill(in.h0, randn);
  }
  if (varlen) {
    in.cu = Tensor(c.cu_dtype, {static_cast<int64_t>(c.cu_seqlens.size())});
    for (size_t i = 0; i < c.cu_seqlens.size(); ++i) in.cu.set(static_cast<int64_t>(i), static_cast<double>(c.cu_seqlens[i]));
  }
  in.dO = Tensor(c.dtype, {c.B, c.T, c.HV, c.V});
  fill(in.dO, randn);
  if (c.d_final_state) {
    in.dht = Tensor(in.state_dtype(), in.state_shape());
    fill(in.dht, randn);
  }

  fkt_options& o = in.opt;
  o.scale = c.scale != 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.K));
  o.lower_bound = c.gate == Gate::kBoundedSigmoid ? c.lower_bound : 0.0;
  o.has_lower_bound = c.gate == Gate::kBoundedSigmoid;
  o.chunk_size = c.chunk;
  o.use_qk_l2norm_in_kernel = c.l2norm;
  o.use_gate_in_kernel = c.gate != Gate::kPrecomputed;
  o.use_beta_sigmoid_in_kernel = c.beta != BetaAct::kPlain;
  o.allow_neg_eigval = c.beta == BetaAct::kTwoSigmoid;
  o.safe_gate = c.safe_gate;
  o.disable_recompute = c.disable_recompute;
  o.state_v_first = c.state_v_first;
  o.backend = FKT_BACKEND_AUTO;
  return in;
}

namespace {

// Rows [t0, t0 + len) of batch row b of a [B, T, ...] tensor as a [1, len, ...] tensor.
Tensor take_tokens(const Tensor& src, int64_t b, int64_t t0, int64_t len) {
  std::vector<int64_t> shape = src.shape();
  int64_t inner = 1;
  for (size_t i = 2; i < shape.size(); ++i) inner *= shape[i];
  const int64_t T = shape[1];
  shape[0] = 1;
  shape[1] = len;
  Tensor out(src.dtype(), shape);
  const size_t row_bytes = static_cast<size_t>(inner) * dt_bytes(src.dtype());
  if (len > 0) std::memcpy(out.data(), src.data() + (b * T + t0) * row_bytes, len * row_bytes);
  return out;
}

// Entry n of the leading dimension of src as a [1, ...] tensor.
Tensor take_leading(const Tensor& src, int64_t n) {
  std::vector<int64_t> shape = src.shape();
  const size_t each = src.bytes() / shape[0];
  shape[0] = 1;
  Tensor out(src.dtype(), shape);
  std::memcpy(out.data(), src.data() + n * each, each);
  return out;
}

}  // namespace

Instance slice_sequence(Instance& in, int64_t b, int64_t t0, int64_t len, int64_t n) {
  Instance out;
  out.cfg = in.cfg;
  out.cfg.B = 1;
  out.cfg.T = len;
  out.cfg.cu_seqlens.clear();
  out.N = 1;
  out.opt = in.opt;
  out.q = take_tokens(in.q, b, t0, len);
  out.k = take_tokens(in.k, b, t0, len);
  out.v = take_tokens(in.v, b, t0, len);
  out.g = take_tokens(in.g, b, t0, len);
  out.beta = take_tokens(in.beta, b, t0, len);
  out.dO = take_tokens(in.dO, b, t0, len);
  out.A_log = in.A_log;
  out.dt_bias = in.dt_bias;
  if (!in.h0.empty()) out.h0 = take_leading(in.h0, n);
  if (!in.dht.empty()) out.dht = take_leading(in.dht, n);
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Runners

std::vector<std::pair<std::string, const Tensor*>> Result::named() const {
  std::vector<std::pair<std::string, const Tensor*>> out;
  const std::pair<const char*, const Tensor*> all[] = {
      {"o", &o},         {"final_state", &final_state}, {"dq", &dq},         {"dk", &dk},
      {"dv", &dv},       {"dg", &dg},                   {"dbeta", &dbeta},   {"dA_log", &dA_log},
      {"ddt_bias", &ddt_bias}, {"dh0", &dh0}};
  for (const auto& [name, t] : all)
    if (!t->empty()) out.push_back({name, t});
  return out;
}

const Tensor* Result::find(const std::string& name) const {
  for (const auto& [n, t] : named())
    if (n == name) return t;
  return nullptr;
}

namespace {

bool wanted(const RunFlags& f, const char* name) {
  return f.only.empty() || std::find(f.only.begin(), f.only.end(), name) != f.only.end();
}

// Allocates the gradient outputs in `r` (dtype f64 for the gold) and fills io with them.
void make_grads(Instance& in, Result& r, fkt_backward_io& io, bool f64, const RunFlags& f) {
  auto like = [&](const Tensor& t) { return Tensor(f64 ? DT::kF64 : t.dtype(), t.logical_shape()); };
  if (wanted(f, "dq")) r.dq = like(in.q);
  if (wanted(f, "dk")) r.dk = like(in.k);
  if (wanted(f, "dv")) r.dv = like(in.v);
  if (wanted(f, "dg")) r.dg = like(in.g);
  if (wanted(f, "dbeta")) r.dbeta = like(in.beta);
  if (!in.A_log.empty() && wanted(f, "dA_log")) r.dA_log = like(in.A_log);
  if (!in.dt_bias.empty() && wanted(f, "ddt_bias")) r.ddt_bias = like(in.dt_bias);
  if (!in.h0.empty() && wanted(f, "dh0")) r.dh0 = like(in.h0);
  io.d_o = in.dO.raw();
  io.d_final_state = in.dht.raw();
  io.dq = r.dq.raw();
  io.dk = r.dk.raw();
  io.dv = r.dv.raw();
  io.dg = r.dg.raw();
  io.dbeta = r.dbeta.raw();
  io.dA_log = r.dA_log.raw();
  io.ddt_bias = r.ddt_bias.raw();
  io.dh0 = r.dh0.raw();
}

Tensor buffer(uint64_t bytes) { return bytes ? Tensor(DT::kU8, {static_cast<int64_t>(bytes)}) : Tensor(); }

}  // namespace

Result run_backend(Instance& in, const RunFlags& flags) {
  Result r;
  fkt_inputs x = in.inputs();
  fkt_sizes sizes{};
  if (fkt_plan_sizes(&x, &in.opt, &sizes) != 0) {
    ADD_FAILURE() << "fkt_plan_sizes failed: " << fkt_last_error();
    return r;
  }
  EXPECT_EQ(sizes.num_sequences, in.N);
  const Config& c = in.cfg;
  r.o = Tensor(c.dtype, {c.B, c.T, c.HV, c.V});
  if (c.final_state) r.final_state = Tensor(in.state_dtype(), in.state_shape());
  if (flags.intermediate) {
    r.intermediate = Tensor(c.dtype, c.state_v_first ? std::vector<int64_t>{c.B, sizes.num_chunks, c.HV, c.V, c.K}
                                                     : std::vector<int64_t>{c.B, sizes.num_chunks, c.HV, c.K, c.V});
  }
  Tensor workspace = buffer(sizes.forward_workspace_bytes);
  fkt_forward_outputs out{r.o.raw(), r.final_state.raw(), r.intermediate.raw(), workspace.raw()};
  if (fkt_forward(&x, &in.opt, &out, nullptr) != 0) {
    ADD_FAILURE() << "fkt_forward failed: " << fkt_last_error();
    return r;
  }
  if (!flags.backward) return r;
  fkt_backward_io io{};
  make_grads(in, r, io, false, flags);
  Tensor bwd_workspace = buffer(sizes.backward_workspace_bytes);
  io.workspace = bwd_workspace.raw();
  if (fkt_backward(&x, &in.opt, &io, nullptr) != 0) ADD_FAILURE() << "fkt_backward failed: " << fkt_last_error();
  return r;
}

Result run_gold(Instance& in, bool backward) {
  Result r;
  fkt_inputs x = in.inputs();
  const Config& c = in.cfg;
  r.o = Tensor(DT::kF64, {c.B, c.T, c.HV, c.V});
  r.final_state = Tensor(DT::kF64, in.state_shape());
  if (fkt_gold_forward(&x, &in.opt, r.o.raw(), r.final_state.raw()) != 0) {
    ADD_FAILURE() << "fkt_gold_forward failed: " << fkt_last_error();
    return r;
  }
  if (!backward) return r;
  fkt_backward_io io{};
  make_grads(in, r, io, true, {});
  if (fkt_gold_backward(&x, &in.opt, &io) != 0) ADD_FAILURE() << "fkt_gold_backward failed: " << fkt_last_error();
  return r;
}

// ---------------------------------------------------------------------------------------------------
// Measures

double dot(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  double s = 0;
  for (int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i) s += a.get(i) * b.get(i);
  return s;
}

double norm(const Tensor& a) { return std::sqrt(dot(a, a)); }

double rel_rms(const Tensor& x, const Tensor& ref) {
  EXPECT_EQ(x.numel(), ref.numel());
  double diff = 0, base = 0;
  for (int64_t i = 0; i < std::min(x.numel(), ref.numel()); ++i) {
    const double d = x.get(i) - ref.get(i);
    diff += d * d;
    base += ref.get(i) * ref.get(i);
  }
  if (std::isnan(diff) || std::isnan(base)) return std::numeric_limits<double>::quiet_NaN();
  return base > 0 ? std::sqrt(diff / base) : std::sqrt(diff);
}

double max_abs_diff(const Tensor& x, const Tensor& ref) {
  double m = 0;
  for (int64_t i = 0; i < std::min(x.numel(), ref.numel()); ++i) {
    const double d = std::fabs(x.get(i) - ref.get(i));
    if (std::isnan(d)) return std::numeric_limits<double>::quiet_NaN();
    m = std::max(m, d);
  }
  return m;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

Tensor reduction_magnitudes(Instance& in, const Result& ref, const std::string& name) {
  const Config& c = in.cfg;
  if ((name != "dA_log" && name != "ddt_bias") || c.gate == Gate::kPrecomputed || ref.dg.empty()) return Tensor();
  const int64_t K = c.K, HV = c.HV;
  std::vector<double> sums(name == "dA_log" ? HV : HV * K, 0.0);
  for (int64_t i = 0; i < ref.dg.numel(); ++i) {
    const int64_t d = i % K, h = i / K % HV;
    const double dg = ref.dg.get(i);
    double term = dg;  // ddt_bias[h, d] = sum over b, t of dg
    if (name == "dA_log") {
      const double x = in.g.get(i) + (in.dt_bias.empty() ? 0.0 : in.dt_bias.get(h * K + d));
      if (c.gate == Gate::kSoftplus) {
        // da * a with dg = -exp(A_log) * softplus'(x) * da and a = -exp(A_log) * softplus(x)
        term = x > 20 ? dg * x : dg * std::log1p(std::exp(x)) * (1.0 + std::exp(-x));
      } else {
        term = dg * x;  // bounded sigmoid: dA_log = sum dx * x
      }
    }
    sums[name == "dA_log" ? h : h * K + d] += std::fabs(term);
  }
  Tensor out(DT::kF64, {static_cast<int64_t>(sums.size())});
  out.assign(sums);
  return out;
}

void expect_close(const Result& got, const Result& ref, const BoundFn& bound, const std::string& category,
                  const std::string& context, Instance* in) {
  const auto named = got.named();
  ASSERT_FALSE(named.empty()) << context;
  for (const auto& [name, tensor] : named) {
    const Tensor* r = ref.find(name);
    ASSERT_NE(r, nullptr) << context << ": the reference has no " << name;
    ASSERT_EQ(tensor->numel(), r->numel()) << context << ": " << name;
    const double ref_norm = norm(*r);
    EXPECT_GT(ref_norm, 0.0) << context << ": reference " << name << " is zero; the comparison is vacuous";
    const double rel = rel_rms(*tensor, *r);
    record_error(category, name, rel);
    double err = rel;
    std::string measure = "rel RMS error";
    const Tensor magnitudes = in ? reduction_magnitudes(*in, ref, name) : Tensor();
    if (!magnitudes.empty()) {
      err = std::isnan(rel) ? rel : rel * ref_norm / norm(magnitudes);
      measure = "error relative to the sum of |terms|";
      record_error(category, name + "/sum|terms|", err);
    }
    EXPECT_LE(err, bound(name, tensor->dtype()))
        << context << ": " << name << " " << measure << " " << err << " (rel RMS " << rel << ", max abs diff "
        << max_abs_diff(*tensor, *r) << ")";
  }
}

// ---------------------------------------------------------------------------------------------------
// Error summary, printed after all tests of the process ran.

namespace {

struct ErrorLog {
  std::mutex mutex;
  std::map<std::string, std::map<std::string, double>> worst;
};

ErrorLog& error_log() {
  static ErrorLog log;
  return log;
}

class ErrorSummary : public ::testing::Environment {
 public:
  void TearDown() override {
    ErrorLog& log = error_log();
    std::lock_guard<std::mutex> lock(log.mutex);
    if (log.worst.empty()) return;
    std::printf("[ summary  ] worst measured errors (rel RMS unless named otherwise)\n");
    for (const auto& [category, tensors] : log.worst) {
      std::printf("[ summary  ] %-28s", category.c_str());
      for (const auto& [name, value] : tensors) std::printf(" %s=%.2e", name.c_str(), value);
      std::printf("\n");
    }
  }
};

[[maybe_unused]] ::testing::Environment* const g_summary = ::testing::AddGlobalTestEnvironment(new ErrorSummary);

}  // namespace

void record_error(const std::string& category, const std::string& tensor, double value) {
  ErrorLog& log = error_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  double& slot = log.worst[category][tensor];
  if (std::isnan(value) || value > slot) slot = value;
}

}  // namespace fkt_test
