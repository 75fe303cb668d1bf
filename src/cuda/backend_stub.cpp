// The CUDA backend as seen by a build without nvcc: every entry point refuses with the reason.
#include "core/error.hpp"
#include "cuda/backend.hpp"

namespace fkt::cuda {
namespace {

[[noreturn]] void not_built(const char* what, const char* tensor = "q") {
  FKT_FAIL() << tensor << ": the tensors are on a CUDA device, but this build of flash_kda_train has no CUDA backend "
                "(nvcc was not found when it was built), so "
             << what << " cannot run; move the tensors to the CPU or rebuild with the CUDA toolkit";
}

}  // namespace

bool built() { return false; }
void check_supported(const Problem&) { not_built("chunk_kda"); }
uint64_t forward_workspace_bytes(const Problem&, bool) { not_built("chunk_kda"); }
uint64_t backward_workspace_bytes(const Problem&) { not_built("the backward"); }
uint64_t saved_bytes(const Problem&) { not_built("chunk_kda"); }
void forward(const Problem&, const fkt_forward_outputs&, void*) { not_built("chunk_kda"); }
void backward(const Problem&, const fkt_backward_io&, void*) { not_built("the backward"); }
void fwd_gate_cumsum(const Problem&, float*, void*) { not_built("the gate-cumsum stage"); }
uint64_t cp_forward_summary_workspace_bytes(const Problem&) { not_built("the context-parallel summary"); }
uint64_t cp_backward_summary_workspace_bytes(const Problem&) { not_built("the context-parallel summary"); }
void cp_forward_summary(const Problem&, int64_t, float*, char*, void*) { not_built("the context-parallel summary"); }
void cp_backward_summary(const Problem&, const fkt_tensor*, int64_t, float*, char*, void*) {
  not_built("the context-parallel summary");
}
void cp_fold(const float*, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool, float*, int, void*) {
  not_built("the context-parallel fold", "summaries");
}

}  // namespace fkt::cuda
