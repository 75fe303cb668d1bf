#include "core/problem.hpp"

#include <cmath>
#include <limits>

#include "core/carver.hpp"
#include "core/error.hpp"

namespace fkt {
namespace {

void expect_shape(const TensorRef& t, const std::vector<int64_t>& shape, const char* what) {
  FKT_CHECK(t.shape == shape) << t.name << ": expected shape " << what << " = " << shape_str(shape)
                              << ", got " << t.shape_str();
}

void expect_float(const TensorRef& t) {
  FKT_CHECK(t.dtype == DType::kBF16 || t.dtype == DType::kF16 || t.dtype == DType::kF32 ||
            t.dtype == DType::kF64)
      << t.name << ": expected bfloat16, float16, float32 or float64, got " << dtype_name(t.dtype);
}

void expect_device(const TensorRef& t, const fkt_device& device) {
  FKT_CHECK(same_device(t.raw->device, device))
      << t.name << ": expected a tensor on " << device_str(device) << " (the device of q), got one on "
      << device_str(t.raw->device) << "; all tensors must be on the same device";
}

void expect_offset_dtype(const TensorRef& cu) {
  FKT_CHECK(cu.dtype == DType::kI32 || cu.dtype == DType::kI64)
      << cu.name << ": expected int32 or int64, got " << dtype_name(cu.dtype);
}

// Element i of a 1-D int32 / int64 offsets tensor in host memory (any stride).
int64_t offset_at(const TensorRef& cu, int64_t i) {
  const char* at = cu.bytes() + i * cu.strides[0] * dtype_bytes(cu.dtype);
  return cu.dtype == DType::kI32 ? *reinterpret_cast<const int32_t*>(at) : *reinterpret_cast<const int64_t*>(at);
}

// cu_seqlens given with its host copy cu_seqlens_cpu (whose offsets the planner read): the same
// dtype family and length, and, when it is readable here (on the host), the same offsets; on a GPU
// the two must agree by contract (reading it would copy to the host).
void check_device_offsets(const TensorRef& cu, const std::vector<int64_t>& offsets) {
  expect_offset_dtype(cu);
  const int64_t count = static_cast<int64_t>(offsets.size());
  FKT_CHECK(cu.shape == std::vector<int64_t>{count})
      << "cu_seqlens: expected a 1-D tensor of N + 1 = " << count << " offsets (the length of cu_seqlens_cpu), got "
      << "shape " << cu.shape_str();
  if (!cu.on_cpu()) return;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t offset = offset_at(cu, i);
    FKT_CHECK(offset == offsets[i]) << "cu_seqlens: expected the offsets of its host copy cu_seqlens_cpu, got "
                                    << "cu_seqlens[" << i << "] = " << offset << " where cu_seqlens_cpu[" << i
                                    << "] = " << offsets[i];
  }
}

// Reads cu_seqlens from host memory into token offsets, checking every contract of kda-math.md section 5.
std::vector<int64_t> read_offsets(const TensorRef& cu, int64_t total) {
  FKT_CHECK(cu.ndim() == 1 && cu.shape[0] >= 2)
      << cu.name << ": expected a 1-D tensor [N + 1] with N >= 1, got shape " << cu.shape_str();
  expect_offset_dtype(cu);
  FKT_CHECK(cu.on_cpu()) << cu.name
                         << ": the planner reads sequence offsets on the host; pass cu_seqlens_cpu "
                            "(a host copy) when cu_seqlens lives on the GPU";
  std::vector<int64_t> offsets(cu.shape[0]);
  for (int64_t i = 0; i < cu.shape[0]; ++i) offsets[i] = offset_at(cu, i);
  FKT_CHECK(offsets[0] == 0) << cu.name << ": expected cu_seqlens[0] == 0, got " << offsets[0];
  for (size_t i = 1; i < offsets.size(); ++i) {
    FKT_CHECK(offsets[i] >= offsets[i - 1])
        << cu.name << ": expected non-decreasing offsets, got cu_seqlens[" << i << "] = " << offsets[i]
        << " < cu_seqlens[" << i - 1 << "] = " << offsets[i - 1];
  }
  FKT_CHECK(offsets.back() == total) << cu.name << ": expected the last offset to equal the token count T = "
                                     << total << ", got " << offsets.back();
  return offsets;
}

void check_options(const fkt_options& opt, bool has_A_log) {
  FKT_CHECK(opt.chunk_size == 32 || opt.chunk_size == 64)
      << "chunk_size: must be either 32 or 64, got " << opt.chunk_size;
  FKT_CHECK(std::isfinite(opt.scale)) << "scale: expected a finite number, got " << opt.scale;
  FKT_CHECK(!opt.allow_neg_eigval || opt.use_beta_sigmoid_in_kernel)
      << "allow_neg_eigval: requires use_beta_sigmoid_in_kernel=True (beta = 2 * sigmoid(beta))";
  FKT_CHECK(!opt.has_lower_bound || std::isfinite(opt.lower_bound))
      << "lower_bound: expected a finite number, got " << opt.lower_bound;
  if (opt.use_gate_in_kernel) {
    FKT_CHECK(has_A_log || opt.has_lower_bound)
        << "A_log: required when use_gate_in_kernel=True and lower_bound is None (the softplus gate "
           "-exp(A_log) * softplus(g + dt_bias) needs it)";
    if (opt.safe_gate) {
      FKT_CHECK(opt.has_lower_bound)
          << "lower_bound: required when safe_gate=True and use_gate_in_kernel=True; expected a value "
             "in [-5, 0)";
      FKT_CHECK(opt.lower_bound >= -5.0 && opt.lower_bound < 0.0)
          << "lower_bound: expected a value in [-5, 0) with safe_gate=True, got " << opt.lower_bound;
    }
  }
  FKT_CHECK(opt.backend == FKT_BACKEND_AUTO || opt.backend == FKT_BACKEND_CPU || opt.backend == FKT_BACKEND_CUDA)
      << "backend: expected auto (0), cpu (1) or cuda (2), got " << opt.backend;
  FKT_CHECK(opt.forward_pieces >= -1 && opt.forward_pieces <= FKT_MOST_FORWARD_PIECES)
      << "forward_pieces: expected -1 (the planner's choice), 0 or 1 (the whole call at once) or a count up to "
      << FKT_MOST_FORWARD_PIECES << ", got " << opt.forward_pieces;
}

}  // namespace

std::vector<int64_t> Problem::state_shape() const {
  return state_v_first ? std::vector<int64_t>{N, HV, V, K} : std::vector<int64_t>{N, HV, K, V};
}

Problem make_problem(const fkt_inputs& in, const fkt_options& opt) {
  Problem p;
  FKT_CHECK(in.q && in.k && in.v && in.g && in.beta) << "q, k, v, g and beta are required tensors";
  p.q = TensorRef(in.q, "q");
  p.k = TensorRef(in.k, "k");
  p.v = TensorRef(in.v, "v");
  p.g = TensorRef(in.g, "g");
  p.beta = TensorRef(in.beta, "beta");
  const bool gate_in_kernel = opt.use_gate_in_kernel != 0;
  // Without the in-kernel gate, A_log and dt_bias are ignored (kda-math.md section 1.3, step 5).
  if (gate_in_kernel) {
    p.A_log = TensorRef(in.A_log, "A_log");
    p.dt_bias = TensorRef(in.dt_bias, "dt_bias");
  }
  p.initial_state = TensorRef(in.initial_state, "initial_state");
  p.cu_seqlens = TensorRef(in.cu_seqlens_cpu ? in.cu_seqlens_cpu : in.cu_seqlens,
                           in.cu_seqlens_cpu ? "cu_seqlens_cpu" : "cu_seqlens");
  check_options(opt, p.A_log.present());

  FKT_CHECK(p.q.ndim() == 4) << "q: expected a 4-D tensor [B, T, H, K], got shape " << p.q.shape_str();
  FKT_CHECK(p.k.shape == p.q.shape) << "k: expected the shape of q " << p.q.shape_str() << ", got "
                                    << p.k.shape_str();
  FKT_CHECK(p.v.ndim() == 4) << "v: expected a 4-D tensor [B, T, HV, V], got shape " << p.v.shape_str();
  p.B = p.q.shape[0];
  p.T = p.q.shape[1];
  p.H = p.q.shape[2];
  p.K = p.q.shape[3];
  p.HV = p.v.shape[2];
  p.V = p.v.shape[3];
  FKT_CHECK(p.v.shape[0] == p.B && p.v.shape[1] == p.T)
      << "v: expected the batch and token extents of q [" << p.B << ", " << p.T << "], got shape "
      << p.v.shape_str();
  FKT_CHECK(p.K >= 1) << "q: expected a head dimension K >= 1, got K = " << p.K;
  FKT_CHECK(p.H >= 1 && p.V >= 1 && p.HV >= 1)
      << "q, v: expected non-zero head counts and head dims, got q " << p.q.shape_str() << " and v "
      << p.v.shape_str();
  FKT_CHECK(p.K <= 256) << "q: expected head dim K <= 256, got " << p.K;
  FKT_CHECK(p.HV % p.H == 0) << "v: expected the value head count HV to be a multiple of the query/key head "
                                "count H (GVA), got HV = "
                             << p.HV << ", H = " << p.H;
  expect_shape(p.g, {p.B, p.T, p.HV, p.K}, "[B, T, HV, K]");
  expect_shape(p.beta, {p.B, p.T, p.HV}, "[B, T, HV]");

  for (const TensorRef* t : {&p.q, &p.k, &p.v, &p.g, &p.beta}) expect_float(*t);
  FKT_CHECK(p.k.dtype == p.q.dtype) << "k: expected the dtype of q (" << dtype_name(p.q.dtype) << "), got "
                                    << dtype_name(p.k.dtype);
  p.input_dtype = p.q.dtype;
  p.fp64 = p.q.dtype == DType::kF64;
  // Inputs other than float64 are computed in float32: a scale or lower_bound past its range would
  // turn into an infinity there, and the outputs into NaN.
  if (!p.fp64) {
    constexpr double kFloatMax = std::numeric_limits<float>::max();
    FKT_CHECK(std::fabs(opt.scale) <= kFloatMax)
        << "scale: expected a value within float32's range (|scale| <= 3.4e38), which " << dtype_name(p.q.dtype)
        << " inputs are computed in; got " << opt.scale;
    FKT_CHECK(!opt.has_lower_bound || std::fabs(opt.lower_bound) <= kFloatMax)
        << "lower_bound: expected a value within float32's range (|lower_bound| <= 3.4e38), which "
        << dtype_name(p.q.dtype) << " inputs are computed in; got " << opt.lower_bound;
  }

  p.device = in.q->device;
  FKT_CHECK(p.device.device_type == FKT_DEVICE_CPU || p.device.device_type == FKT_DEVICE_CUDA)
      << "q: expected a CPU or CUDA tensor, got one on " << device_str(p.device);
  for (const TensorRef* t : {&p.k, &p.v, &p.g, &p.beta, &p.A_log, &p.dt_bias, &p.initial_state}) {
    if (t->present()) expect_device(*t, p.device);
  }
  if (in.cu_seqlens && !in.cu_seqlens_cpu) expect_device(TensorRef(in.cu_seqlens, "cu_seqlens"), p.device);

  if (gate_in_kernel) {
    if (p.A_log.present()) {
      expect_float(p.A_log);
      FKT_CHECK(p.A_log.numel() == p.HV && p.A_log.contiguous())
          << "A_log: expected a contiguous tensor of HV = " << p.HV << " elements, got shape "
          << p.A_log.shape_str();
    }
    if (p.dt_bias.present()) {
      expect_float(p.dt_bias);
      FKT_CHECK(p.dt_bias.numel() == p.HV * p.K && p.dt_bias.contiguous())
          << "dt_bias: expected a contiguous tensor of HV * K = " << p.HV * p.K << " elements, got shape "
          << p.dt_bias.shape_str();
    }
    p.gate = opt.has_lower_bound ? GateMode::kBoundedSigmoid : GateMode::kSoftplus;
  }
  p.lower_bound = opt.lower_bound;
  p.beta_mode = !opt.use_beta_sigmoid_in_kernel ? BetaMode::kPlain
                : opt.allow_neg_eigval         ? BetaMode::kTwoSigmoid
                                               : BetaMode::kSigmoid;
  p.scale = opt.scale;
  p.chunk = opt.chunk_size;
  p.l2norm = opt.use_qk_l2norm_in_kernel != 0;
  p.state_v_first = opt.state_v_first != 0;

  if (p.cu_seqlens.present()) {
    p.varlen = true;
    FKT_CHECK(p.B == 1) << "cu_seqlens: packed variable-length input requires batch size B == 1, got B = "
                        << p.B << " (q shape " << p.q.shape_str() << ")";
    const std::vector<int64_t> offsets = read_offsets(p.cu_seqlens, p.T);
    p.N = static_cast<int64_t>(offsets.size()) - 1;
    if (in.cu_seqlens && in.cu_seqlens_cpu) check_device_offsets(TensorRef(in.cu_seqlens, "cu_seqlens"), offsets);
    for (int64_t n = 0; n < p.N; ++n) p.sequences.push_back({0, offsets[n], offsets[n + 1] - offsets[n], 0});
  } else {
    p.N = p.B;
    for (int64_t b = 0; b < p.B; ++b) p.sequences.push_back({b, 0, p.T, 0});
  }
  int64_t chunks = 0;
  for (Sequence& s : p.sequences) {
    // Dense rows each own ceil(T / C) rows of intermediate_states; varlen sequences are packed.
    s.chunk_offset = p.varlen ? chunks : 0;
    chunks += (s.length + p.chunk - 1) / p.chunk;
    p.max_length = std::max(p.max_length, s.length);
  }
  p.num_chunks = p.varlen ? chunks : (p.T + p.chunk - 1) / p.chunk;

  if (p.initial_state.present()) {
    FKT_CHECK(p.initial_state.dtype == p.state_dtype())
        << "initial_state: expected " << dtype_name(p.state_dtype()) << " (recurrent state is kept in "
        << (p.fp64 ? "float64 for float64 inputs" : "float32") << "), got " << dtype_name(p.initial_state.dtype);
    FKT_CHECK(p.initial_state.ndim() == 4 && p.initial_state.shape[0] == p.N)
        << "initial_state: expected one state per sequence, N = " << p.N
        << (p.varlen ? " (len(cu_seqlens) - 1)" : " (the batch size)") << ", got shape "
        << p.initial_state.shape_str();
    expect_shape(p.initial_state, p.state_shape(), p.state_v_first ? "[N, HV, V, K] (state_v_first=True)"
                                                                  : "[N, HV, K, V] (state_v_first=False)");
  }

  const bool on_cuda = p.device.device_type == FKT_DEVICE_CUDA;
  if (on_cuda && p.varlen) {
    // Kernels read the offsets on the device; the planner has read the same offsets on the host.
    FKT_CHECK(in.cu_seqlens != nullptr)
        << "cu_seqlens: CUDA kernels read the sequence offsets on the device; pass cu_seqlens on "
        << device_str(p.device) << " together with its host copy cu_seqlens_cpu";
    p.cu_seqlens_device = TensorRef(in.cu_seqlens, "cu_seqlens");
    const TensorRef& cu = p.cu_seqlens_device;
    expect_device(cu, p.device);
    FKT_CHECK(cu.contiguous()) << "cu_seqlens: expected a contiguous tensor (the CUDA kernels read it as an "
                                  "array), got a strided one";
  }
  FKT_CHECK(opt.backend != FKT_BACKEND_CPU || !on_cuda)
      << "backend: the CPU backend was requested but the tensors are on " << device_str(p.device);
  FKT_CHECK(opt.backend != FKT_BACKEND_CUDA || on_cuda)
      << "backend: the CUDA backend was requested but the tensors are on " << device_str(p.device);
  p.backend = on_cuda ? Backend::kCuda : Backend::kCpu;
  p.keep_forward = on_cuda && opt.disable_recompute != 0;
  p.forward_pieces = opt.forward_pieces;
  return p;
}

namespace {

void expect_output(const fkt_tensor* raw, const char* name, const std::vector<int64_t>& shape, DType dtype,
                   const fkt_device& device) {
  TensorRef t(raw, name);
  FKT_CHECK(t.shape == shape) << name << ": expected an output of shape " << shape_str(shape) << ", got "
                              << t.shape_str();
  FKT_CHECK(t.dtype == dtype) << name << ": expected an output of dtype " << dtype_name(dtype) << ", got "
                              << dtype_name(t.dtype);
  FKT_CHECK(t.contiguous()) << name << ": expected a contiguous (row-major, dense) output";
  expect_device(t, device);
}

DType out_dtype(DType natural, bool f64) { return f64 ? DType::kF64 : natural; }

}  // namespace

void expect_buffer(const fkt_tensor* raw, const char* name, uint64_t bytes, const fkt_device& device) {
  if (bytes == 0) return;
  FKT_CHECK(raw != nullptr) << name << ": expected a uint8 buffer of " << bytes << " bytes, got none";
  TensorRef t(raw, name);
  FKT_CHECK(t.dtype == DType::kU8 && t.ndim() == 1 && t.contiguous())
      << name << ": expected a contiguous 1-D uint8 tensor, got " << dtype_name(t.dtype) << " of shape "
      << t.shape_str();
  FKT_CHECK(static_cast<uint64_t>(t.numel()) >= bytes)
      << name << ": expected at least " << bytes << " bytes, got " << t.numel();
  // Arrays are carved at aligned offsets from the base: the base itself must be aligned.
  FKT_CHECK(reinterpret_cast<uintptr_t>(t.bytes()) % Carver::kBaseAlign == 0)
      << name << ": expected a buffer aligned to " << Carver::kBaseAlign << " bytes (as allocators return them), "
      << "got an address " << reinterpret_cast<uintptr_t>(t.bytes()) % Carver::kBaseAlign << " bytes past a boundary";
  expect_device(t, device);
}

void expect_d_o(const Problem& p, const fkt_tensor* raw) {
  FKT_CHECK(raw != nullptr) << "d_o: the gradient of o is required";
  TensorRef d_o(raw, "d_o");
  expect_float(d_o);
  expect_device(d_o, p.device);
  FKT_CHECK(d_o.shape == std::vector<int64_t>({p.B, p.T, p.HV, p.V}))
      << "d_o: expected the shape of o " << shape_str({p.B, p.T, p.HV, p.V}) << ", got " << d_o.shape_str();
}

void check_forward_outputs(const Problem& p, const fkt_forward_outputs& out, uint64_t workspace_bytes,
                           uint64_t saved_bytes) {
  FKT_CHECK(out.o != nullptr) << "o: the output tensor is required";
  expect_output(out.o, "o", {p.B, p.T, p.HV, p.V}, p.input_dtype, p.device);
  if (out.final_state) expect_output(out.final_state, "final_state", p.state_shape(), p.state_dtype(), p.device);
  if (out.intermediate_states) {
    const std::vector<int64_t> shape = p.state_v_first ? std::vector<int64_t>{p.B, p.num_chunks, p.HV, p.V, p.K}
                                                       : std::vector<int64_t>{p.B, p.num_chunks, p.HV, p.K, p.V};
    expect_output(out.intermediate_states, "intermediate_states", shape, p.input_dtype, p.device);
  }
  expect_buffer(out.workspace, "workspace", workspace_bytes, p.device);
  if (out.saved) expect_buffer(out.saved, "saved", saved_bytes, p.device);  // none: no backward follows
}

void check_gold_forward_outputs(const Problem& p, const fkt_tensor* o, const fkt_tensor* final_state) {
  FKT_CHECK(o != nullptr) << "o: the output tensor is required";
  expect_output(o, "o", {p.B, p.T, p.HV, p.V}, DType::kF64, p.device);
  if (final_state) expect_output(final_state, "final_state", p.state_shape(), DType::kF64, p.device);
}

void check_backward_io(const Problem& p, const fkt_backward_io& io, uint64_t workspace_bytes, uint64_t saved_bytes,
                       bool f64) {
  expect_d_o(p, io.d_o);
  if (io.d_final_state) {
    TensorRef d_ht(io.d_final_state, "d_final_state");
    expect_device(d_ht, p.device);
    FKT_CHECK(d_ht.dtype == p.state_dtype()) << "d_final_state: expected " << dtype_name(p.state_dtype())
                                             << ", got " << dtype_name(d_ht.dtype);
    FKT_CHECK(d_ht.shape == p.state_shape()) << "d_final_state: expected shape " << shape_str(p.state_shape())
                                             << ", got " << d_ht.shape_str();
  }
  if (io.dq) expect_output(io.dq, "dq", p.q.shape, out_dtype(p.q.dtype, f64), p.device);
  if (io.dk) expect_output(io.dk, "dk", p.k.shape, out_dtype(p.k.dtype, f64), p.device);
  if (io.dv) expect_output(io.dv, "dv", p.v.shape, out_dtype(p.v.dtype, f64), p.device);
  if (io.dg) expect_output(io.dg, "dg", p.g.shape, out_dtype(p.g.dtype, f64), p.device);
  if (io.dbeta) expect_output(io.dbeta, "dbeta", p.beta.shape, out_dtype(p.beta.dtype, f64), p.device);
  if (io.dA_log) {
    FKT_CHECK(p.A_log.present()) << "dA_log: requested, but there is no A_log (it needs use_gate_in_kernel=True)";
    expect_output(io.dA_log, "dA_log", p.A_log.shape, out_dtype(p.A_log.dtype, f64), p.device);
  }
  if (io.ddt_bias) {
    FKT_CHECK(p.dt_bias.present())
        << "ddt_bias: requested, but there is no dt_bias (it needs use_gate_in_kernel=True)";
    expect_output(io.ddt_bias, "ddt_bias", p.dt_bias.shape, out_dtype(p.dt_bias.dtype, f64), p.device);
  }
  if (io.dh0) {
    FKT_CHECK(p.initial_state.present()) << "dh0: requested, but there is no initial_state";
    expect_output(io.dh0, "dh0", p.state_shape(), out_dtype(p.state_dtype(), f64), p.device);
  }
  expect_buffer(io.workspace, "workspace", workspace_bytes, p.device);
  expect_buffer(io.saved, "saved", saved_bytes, p.device);
}

}  // namespace fkt
