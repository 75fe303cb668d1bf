// Host side of the CUDA forward: what it supports, its workspace, and the launches F1 to F5.
// No allocation, no copy and no synchronisation: everything is enqueued on the caller's stream.
#include "core/error.hpp"
#include "cuda/backend.hpp"
#include "cuda/common/check.cuh"
#include "cuda/common/device_guard.cuh"
#include "cuda/sm90/forward/chunk_offsets.cuh"
#include "cuda/sm90/forward/fwd_intra.cuh"
#include "cuda/sm90/forward/fwd_output.cuh"
#include "cuda/sm90/forward/fwd_state.cuh"

namespace fkt::cuda {
namespace {

constexpr int kMaxHeadDim = 128;  // shared-memory plan of the fp32 stage kernels

template <typename Kernel>
void launch(Kernel kernel, dim3 grid, int threads, size_t smem, cudaStream_t stream, const ForwardParams& params) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  FKT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<grid, threads, smem, stream>>>(params);
  FKT_CUDA_CHECK(cudaGetLastError());
}

ForwardParams make_params(const Problem& p, const fkt_forward_outputs& out) {
  Carver carver(TensorRef(out.workspace, "workspace").bytes());
  ForwardParams params{};
  params.q = p.q.bytes();
  params.k = p.k.bytes();
  params.v = p.v.bytes();
  params.beta = p.beta.bytes();
  params.initial_state = p.initial_state.present() ? reinterpret_cast<const float*>(p.initial_state.bytes()) : nullptr;
  params.cu_seqlens = p.varlen ? p.cu_seqlens_device.bytes() : nullptr;
  params.o = TensorRef(out.o, "o").bytes();
  params.final_state = out.final_state ? reinterpret_cast<float*>(TensorRef(out.final_state, "final_state").bytes())
                                       : nullptr;
  params.intermediate_states =
      out.intermediate_states ? TensorRef(out.intermediate_states, "intermediate_states").bytes() : nullptr;
  params.ws = ForwardWorkspace::carve(carver, p);
  params.qk_dtype = p.q.dtype;
  params.v_dtype = p.v.dtype;
  params.beta_dtype = p.beta.dtype;
  params.o_dtype = p.input_dtype;
  params.offsets_dtype = p.varlen ? p.cu_seqlens_device.dtype : DType::kI64;
  params.beta_mode = p.beta_mode;
  params.l2norm = p.l2norm;
  params.state_v_first = p.state_v_first;
  params.scale = static_cast<float>(p.scale);
  params.T = p.T;
  params.N = p.N;
  params.chunks_per_row = (p.T + p.chunk - 1) / p.chunk;
  params.H = static_cast<int32_t>(p.H);
  params.HV = static_cast<int32_t>(p.HV);
  params.K = static_cast<int32_t>(p.K);
  params.V = static_cast<int32_t>(p.V);
  params.chunk = p.chunk;
  return params;
}

}  // namespace

void check_supported(const Problem& p) {
  for (const TensorRef* t : {&p.q, &p.k, &p.v, &p.g, &p.beta}) {
    FKT_CHECK(t->dtype != DType::kF64) << t->name << ": the CUDA backend reads bfloat16, float16 or float32, got float64";
    FKT_CHECK(t->contiguous()) << t->name << ": the CUDA backend reads contiguous tensors, got strides "
                               << shape_str(t->strides) << " for shape " << t->shape_str();
  }
  FKT_CHECK(!p.initial_state.present() || p.initial_state.contiguous())
      << "initial_state: the CUDA backend reads a contiguous tensor, got strides " << shape_str(p.initial_state.strides);
  FKT_CHECK(p.K <= kMaxHeadDim && p.V <= kMaxHeadDim)
      << "q, v: the CUDA backend supports head dims K, V <= " << kMaxHeadDim << ", got K = " << p.K << ", V = " << p.V;
  FKT_CHECK(p.HV <= 65535) << "v: the CUDA backend supports at most 65535 value heads, got " << p.HV;
}

void check_backward_supported(const Problem&) {
  FKT_FAIL() << "d_o: the CUDA backend does not implement the chunk_kda backward yet (the forward runs on CUDA); "
                "train on CPU tensors until the Hopper backward lands";
}

uint64_t forward_workspace_bytes(const Problem& p) {
  Carver measure;
  ForwardWorkspace::carve(measure, p);
  return measure.bytes();
}

void forward(const Problem& p, const fkt_forward_outputs& out, void* stream) {
  const ForwardParams params = make_params(p, out);
  const DeviceGuard device(p.device.device_id);
  const auto s = static_cast<cudaStream_t>(stream);
  const unsigned chunks = static_cast<unsigned>(ForwardWorkspace::chunks(p));
  const unsigned heads = static_cast<unsigned>(p.HV);
  if (p.varlen) launch(chunk_offsets_kernel, dim3(1), ChunkOffsetsConfig::kThreads, 0, s, params);
  fwd_gate_cumsum(p, params.ws.gamma, stream);
  launch(fwd_intra_kernel, dim3(chunks, heads), IntraConfig::kThreads, IntraConfig::smem_bytes(p.chunk, p.K, p.V), s,
         params);
  launch(fwd_state_kernel, dim3(static_cast<unsigned>(p.N), heads, (p.V + StateConfig::kTileV - 1) / StateConfig::kTileV),
         StateConfig::kThreads, StateConfig::smem_bytes(p.chunk, p.K), s, params);
  launch(fwd_output_kernel, dim3(chunks, heads, (p.V + OutputConfig::kTileV - 1) / OutputConfig::kTileV),
         OutputConfig::kThreads, OutputConfig::smem_bytes(p.chunk, p.K), s, params);
}

}  // namespace fkt::cuda
