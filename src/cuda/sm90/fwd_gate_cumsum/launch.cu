// Host side of F1 alone on CUDA (the stage hook's): checks what the kernel supports, fills its
// params and launches it.
// No allocation, no copy and no synchronisation: sequence offsets are read on the device.
#include <cstdint>

#include "core/error.hpp"
#include "cuda/backend.hpp"
#include "cuda/common/check.cuh"
#include "cuda/common/device_guard.cuh"
#include "cuda/sm90/fwd_gate_cumsum/kernel.cuh"
#include "cuda/sm90/launch.cuh"

namespace fkt::cuda {
namespace {

template <typename GT>
void launch_with_offsets(const GateCumsumParams& params, DType offsets, dim3 grid, cudaStream_t stream) {
  const auto kernel =
      offsets == DType::kI64 ? fwd_gate_cumsum_kernel<GT, int64_t> : fwd_gate_cumsum_kernel<GT, int32_t>;
  launch(kernel, grid, GateCumsumConfig::kThreads, 0, stream, params);
}

}  // namespace

void fwd_gate_cumsum(const Problem& p, float* gamma, void* stream) {
  FKT_CHECK(p.g.dtype == DType::kBF16 || p.g.dtype == DType::kF16 || p.g.dtype == DType::kF32)
      << "g: the CUDA gate-cumsum stage reads bfloat16, float16 or float32, got " << dtype_name(p.g.dtype);
  FKT_CHECK(p.g.contiguous()) << "g: the CUDA gate-cumsum stage expects a contiguous tensor, got strides "
                              << shape_str(p.g.strides) << " for shape " << p.g.shape_str();
  const int64_t columns = p.HV * p.K;
  const int64_t column_groups = (columns + GateCumsumConfig::kThreads - 1) / GateCumsumConfig::kThreads;
  FKT_CHECK(column_groups <= GateCumsumConfig::kMaxColumnGroups)
      << "g: the CUDA gate-cumsum stage handles at most " << GateCumsumConfig::kMaxColumnGroups << " * "
      << GateCumsumConfig::kThreads << " elements per token (HV * K), got " << columns;
  const int64_t chunks_per_row = (p.T + p.chunk - 1) / p.chunk;
  const int64_t blocks = p.varlen ? chunks_per_row : p.B * chunks_per_row;
  FKT_CHECK(blocks <= INT32_MAX) << "g: the CUDA gate-cumsum stage launches one block per chunk, at most "
                                 << INT32_MAX << ", got " << blocks;
  if (blocks == 0) return;

  const TensorRef& offsets = p.cu_seqlens_device;
  GateCumsumParams params{};
  params.gate = gate_inputs(p);
  params.cu_seqlens = p.varlen ? offsets.bytes() : nullptr;
  params.gamma = gamma;
  params.T = p.T;
  params.N = p.N;
  params.chunks_per_row = chunks_per_row;
  params.columns = static_cast<int32_t>(columns);
  params.K = static_cast<int32_t>(p.K);
  params.chunk = p.chunk;

  const DeviceGuard device(p.device.device_id);
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(column_groups));
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  with_gate_element(p.g.dtype, [&](auto element) {
    launch_with_offsets<decltype(element)>(params, offsets.dtype, grid, cuda_stream);
  });
}

}  // namespace fkt::cuda
