// The context-parallel part of the C ABI (end of c_api.h): per-sequence summaries and their fold,
// on the backend of the tensors' device (CUDA: the configurations cuda::check_supported accepts).
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/guarded.hpp"
#include "core/problem.hpp"
#include "core/registry.hpp"
#include "cpu/cp_summary.hpp"
#include "cuda/backend.hpp"
#include "flash_kda_train/c_api.h"

namespace {

using fkt::Backend;
using fkt::DType;
using fkt::TensorRef;

fkt::Problem cp_problem(const fkt_inputs* in, const fkt_options* opt) {
  FKT_CHECK(in != nullptr && opt != nullptr) << "inputs and options must not be null";
  fkt::Problem p = fkt::make_problem(*in, *opt);
  fkt::check_supported(p);
  p.keep_forward = false;  // a summary is one self-contained pass: nothing is kept for a backward
  return p;
}

fkt::cpu::CpSizes cp_sizes(const fkt::Problem& p) {
  if (p.backend == Backend::kCpu) return fkt::cpu::cp_plan_sizes(p);
  return {fkt::cuda::cp_forward_summary_workspace_bytes(p), fkt::cuda::cp_backward_summary_workspace_bytes(p)};
}

void check_sequence(const fkt::Problem& p, int64_t sequence) {
  FKT_CHECK(sequence >= 0 && sequence < p.N)
      << "sequence: expected an index in [0, N) with N = " << p.N
      << (p.varlen ? " (len(cu_seqlens) - 1)" : " (the batch size)") << ", got " << sequence;
}

void expect_contiguous_on(const TensorRef& t, const fkt_device& device, const char* whose) {
  FKT_CHECK(t.contiguous()) << t.name << ": expected a contiguous (row-major, dense) tensor, got strides "
                            << fkt::shape_str(t.strides) << " for shape " << t.shape_str();
  FKT_CHECK(fkt::same_device(t.raw->device, device))
      << t.name << ": expected a tensor on " << fkt::device_str(device) << " (the device of " << whose
      << "), got one on " << fkt::device_str(t.raw->device);
}

char* checked_summary(const fkt::Problem& p, const fkt_tensor* raw) {
  FKT_CHECK(raw != nullptr) << "summary: the output tensor is required";
  const TensorRef summary(raw, "summary");
  const std::vector<int64_t> shape{p.HV, p.K, p.V + p.K};
  FKT_CHECK(summary.shape == shape) << "summary: expected shape [HV, K, V + K] = " << fkt::shape_str(shape)
                                    << ", got " << summary.shape_str();
  FKT_CHECK(summary.dtype == p.state_dtype())
      << "summary: expected " << fkt::dtype_name(p.state_dtype()) << " (the state dtype), got "
      << fkt::dtype_name(summary.dtype);
  expect_contiguous_on(summary, p.device, "q");
  return summary.bytes();
}

char* checked_workspace(const fkt::Problem& p, const fkt_tensor* raw, uint64_t bytes) {
  fkt::expect_buffer(raw, "workspace", bytes, p.device);
  return bytes ? TensorRef(raw, "workspace").bytes() : nullptr;
}

}  // namespace

extern "C" {

int fkt_cp_plan_sizes(const fkt_inputs* in, const fkt_options* opt, fkt_cp_sizes* sizes) {
  return fkt::guarded([&] {
    FKT_CHECK(sizes != nullptr) << "sizes must not be null";
    const fkt::Problem p = cp_problem(in, opt);
    const fkt::cpu::CpSizes s = cp_sizes(p);
    *sizes = {s.forward_summary_workspace_bytes, s.backward_summary_workspace_bytes,
              p.backend == Backend::kCpu ? FKT_BACKEND_CPU : FKT_BACKEND_CUDA};
  });
}

int fkt_cp_forward_summary(const fkt_inputs* in, const fkt_options* opt, int64_t sequence, fkt_tensor* summary,
                           fkt_tensor* workspace, void* stream) {
  return fkt::guarded([&] {
    const fkt::Problem p = cp_problem(in, opt);
    check_sequence(p, sequence);
    char* out = checked_summary(p, summary);
    char* ws = checked_workspace(p, workspace, cp_sizes(p).forward_summary_workspace_bytes);
    if (p.backend == Backend::kCpu) return fkt::cpu::cp_forward_summary(p, sequence, out, ws);
    fkt::cuda::cp_forward_summary(p, sequence, reinterpret_cast<float*>(out), ws, stream);
  });
}

int fkt_cp_backward_summary(const fkt_inputs* in, const fkt_options* opt, const fkt_tensor* d_o, int64_t sequence,
                            fkt_tensor* summary, fkt_tensor* workspace, void* stream) {
  return fkt::guarded([&] {
    const fkt::Problem p = cp_problem(in, opt);
    check_sequence(p, sequence);
    fkt::expect_d_o(p, d_o);
    char* out = checked_summary(p, summary);
    char* ws = checked_workspace(p, workspace, cp_sizes(p).backward_summary_workspace_bytes);
    if (p.backend == Backend::kCpu) return fkt::cpu::cp_backward_summary(p, d_o, sequence, out, ws);
    fkt::cuda::cp_backward_summary(p, d_o, sequence, reinterpret_cast<float*>(out), ws, stream);
  });
}

int fkt_cp_fold(const fkt_tensor* summaries, int64_t first, int64_t count, int32_t direction, int32_t state_v_first,
                fkt_tensor* state, void* stream) {
  return fkt::guarded([&] {
    FKT_CHECK(summaries != nullptr) << "summaries: the gathered summaries are required";
    FKT_CHECK(state != nullptr) << "state: the output tensor is required";
    const TensorRef sums(summaries, "summaries");
    const TensorRef out(state, "state");
    FKT_CHECK(sums.ndim() == 4 && sums.shape[2] >= 1 && sums.shape[3] > sums.shape[2])
        << "summaries: expected shape [R, HV, K, V + K] with V >= 1, got " << sums.shape_str();
    FKT_CHECK(sums.dtype == DType::kF32 || sums.dtype == DType::kF64)
        << "summaries: expected float32 or float64, got " << fkt::dtype_name(sums.dtype);
    const int64_t R = sums.shape[0], HV = sums.shape[1], K = sums.shape[2], V = sums.shape[3] - K;
    FKT_CHECK(K <= 256) << "summaries: expected K <= 256, got K = " << K;
    const fkt_device& device = summaries->device;
    FKT_CHECK(device.device_type == FKT_DEVICE_CPU || device.device_type == FKT_DEVICE_CUDA)
        << "summaries: expected a CPU or CUDA tensor, got one on " << fkt::device_str(device);
    expect_contiguous_on(sums, device, "the summaries");
    FKT_CHECK(direction == FKT_CP_FORWARD || direction == FKT_CP_BACKWARD)
        << "direction: expected FKT_CP_FORWARD (0) or FKT_CP_BACKWARD (1), got " << direction;
    FKT_CHECK(first >= 0 && count >= 0 && first + count <= R)
        << "first, count: expected 0 <= first and first + count <= R = " << R << " (the gathered ranks), got first = "
        << first << ", count = " << count;
    const std::vector<int64_t> shape = state_v_first ? std::vector<int64_t>{HV, V, K} : std::vector<int64_t>{HV, K, V};
    FKT_CHECK(out.shape == shape) << "state: expected shape " << (state_v_first ? "[HV, V, K]" : "[HV, K, V]")
                                  << " = " << fkt::shape_str(shape) << ", got " << out.shape_str();
    FKT_CHECK(out.dtype == sums.dtype) << "state: expected the dtype of the summaries ("
                                       << fkt::dtype_name(sums.dtype) << "), got " << fkt::dtype_name(out.dtype);
    expect_contiguous_on(out, device, "the summaries");
    const bool backward = direction == FKT_CP_BACKWARD;
    if (device.device_type == FKT_DEVICE_CUDA) {
      FKT_CHECK(sums.dtype == DType::kF32) << "summaries: the CUDA fold reads float32 summaries (the state dtype of "
                                              "the CUDA backend), got "
                                           << fkt::dtype_name(sums.dtype);
      return fkt::cuda::cp_fold(reinterpret_cast<const float*>(sums.bytes()), HV, K, V, first, count, backward,
                                state_v_first != 0, reinterpret_cast<float*>(out.bytes()), device.device_id, stream);
    }
    if (sums.dtype == DType::kF64) {
      fkt::cpu::cp_fold(reinterpret_cast<const double*>(sums.bytes()), HV, K, V, first, count, backward,
                        state_v_first != 0, reinterpret_cast<double*>(out.bytes()));
    } else {
      fkt::cpu::cp_fold(reinterpret_cast<const float*>(sums.bytes()), HV, K, V, first, count, backward,
                        state_v_first != 0, reinterpret_cast<float*>(out.bytes()));
    }
  });
}

}  // extern "C"
