// Host side of the context-parallel fold on CUDA (fkt_cp_fold); the summaries are modes of the
// state passes, launched from forward/launch.cu and backward/launch.cu. No allocation, no copy and
// no synchronisation: the fold is enqueued on the caller's stream.
#include "core/error.hpp"
#include "cuda/backend.hpp"
#include "cuda/common/device_guard.cuh"
#include "cuda/sm90/cp/fold.cuh"
#include "cuda/sm90/launch.cuh"

namespace fkt::cuda {

void cp_fold(const float* summaries, int64_t HV, int64_t K, int64_t V, int64_t first, int64_t count, bool backward,
             bool state_v_first, float* state, int device_id, void* stream) {
  constexpr int64_t kMaxDim = 128;  // the head dims of the CUDA backend, whose summaries this folds
  FKT_CHECK(K <= kMaxDim && V <= kMaxDim && HV <= 65535)
      << "summaries: the CUDA fold supports the summaries of the CUDA backend, K, V <= " << kMaxDim
      << " and at most 65535 value heads; got K = " << K << ", V = " << V << ", HV = " << HV;
  CpFoldParams params{};
  params.summaries = summaries;
  params.state = state;
  params.first = first;
  params.count = count;
  params.HV = static_cast<int32_t>(HV);
  params.K = static_cast<int32_t>(K);
  params.V = static_cast<int32_t>(V);
  params.backward = backward;
  params.state_v_first = state_v_first;
  const DeviceGuard device(device_id);
  fold_states(params, stream);
}

void fold_states(const CpFoldParams& params, void* stream) {
  const unsigned tiles = static_cast<unsigned>((params.V + FoldConfig::kTile - 1) / FoldConfig::kTile);
  launch(cp_fold_kernel, dim3(static_cast<unsigned>(params.HV), tiles), FoldConfig::kThreads,
         FoldConfig::smem_bytes(params.K), static_cast<cudaStream_t>(stream), params);
}

}  // namespace fkt::cuda
