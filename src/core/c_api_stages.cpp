// The stage test hooks of the C ABI (end of c_api.h): one stage alone, the CPU twin on CPU tensors
// and the CUDA kernel on CUDA tensors, so a GPU test can compare the two on the same inputs.
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/guarded.hpp"
#include "cpu/driver.hpp"
#include "cuda/backend.hpp"
#include "flash_kda_train/c_api.h"

namespace {

// Checks gamma and returns its first element.
float* checked_gamma(const fkt::Problem& p, const fkt_tensor* raw) {
  FKT_CHECK(raw != nullptr) << "gamma: the output tensor is required";
  const fkt::TensorRef gamma(raw, "gamma");
  const std::vector<int64_t> shape{p.B, p.T, p.HV, p.K};
  FKT_CHECK(gamma.shape == shape) << "gamma: expected shape [B, T, HV, K] = " << fkt::shape_str(shape) << ", got "
                                  << gamma.shape_str();
  FKT_CHECK(gamma.dtype == fkt::DType::kF32) << "gamma: expected float32, got " << fkt::dtype_name(gamma.dtype);
  FKT_CHECK(gamma.contiguous()) << "gamma: expected a contiguous (row-major, dense) tensor, got strides "
                                << fkt::shape_str(gamma.strides) << " for shape " << gamma.shape_str();
  FKT_CHECK(fkt::same_device(raw->device, p.device)) << "gamma: expected a tensor on " << fkt::device_str(p.device)
                                                << " (the device of q), got one on " << fkt::device_str(raw->device);
  return reinterpret_cast<float*>(gamma.bytes());
}

// The CPU twin: F0 and F1 chunk by chunk on one scratch slot; gamma rows are copied out.
template <typename Real>
void cpu_gate_cumsum(const fkt::Problem& p, float* gamma) {
  namespace cpu = fkt::cpu;
  // A test hook may allocate; double elements keep the slot aligned for Real = double.
  std::vector<double> slot((cpu::slot_bytes<Real>(p, false) + sizeof(double) - 1) / sizeof(double));
  fkt::Carver carver(slot.data());
  cpu::Scratch<Real> s = cpu::Scratch<Real>::carve(carver, p, false);
  for (const fkt::Sequence& seq : p.sequences) {
    for (int64_t head = 0; head < p.HV; ++head) {
      for (int64_t j = 0; j < cpu::num_chunks(p, seq); ++j) {
        const cpu::ChunkPos c = cpu::chunk_pos(p, seq, head, j);
        cpu::fwd_prepare(p, c, s);
        cpu::fwd_gate_cumsum(p, c, s);
        for (int64_t r = 0; r < c.rows; ++r) {
          float* row = gamma + ((seq.b * p.T + c.first + r) * p.HV + head) * p.K;
          for (int64_t d = 0; d < p.K; ++d) row[d] = static_cast<float>(s.gamma[r * p.K + d]);
        }
      }
    }
  }
}

}  // namespace

extern "C" {

int fkt_stage_gate_cumsum(const fkt_inputs* in, const fkt_options* opt, fkt_tensor* gamma, void* stream) {
  return fkt::guarded([&] {
    FKT_CHECK(in != nullptr && opt != nullptr) << "inputs and options must not be null";
    const fkt::Problem p = fkt::make_problem(*in, *opt);
    float* out = checked_gamma(p, gamma);
    if (p.backend == fkt::Backend::kCuda) fkt::cuda::fwd_gate_cumsum(p, out, stream);
    else if (p.fp64) cpu_gate_cumsum<double>(p, out);
    else cpu_gate_cumsum<float>(p, out);
  });
}

}  // extern "C"
