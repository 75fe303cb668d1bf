// The CUDA backend as seen by a build without nvcc: every entry point refuses with the reason.
#include "core/error.hpp"
#include "cuda/backend.hpp"

namespace fkt::cuda {
namespace {

[[noreturn]] void not_built(const char* what) {
  FKT_FAIL() << "q: the tensors are on a CUDA device, but this build of flash_kda_train has no CUDA backend "
                "(nvcc was not found when it was built), so "
             << what << " cannot run; move the tensors to the CPU or rebuild with the CUDA toolkit";
}

}  // namespace

bool built() { return false; }
void check_supported(const Problem&) { not_built("chunk_kda"); }
uint64_t forward_workspace_bytes(const Problem&) { not_built("chunk_kda"); }
uint64_t backward_workspace_bytes(const Problem&) { not_built("the backward"); }
void forward(const Problem&, const fkt_forward_outputs&, void*) { not_built("chunk_kda"); }
void backward(const Problem&, const fkt_backward_io&, void*) { not_built("the backward"); }
void fwd_gate_cumsum(const Problem&, float*, void*) { not_built("the gate-cumsum stage"); }

}  // namespace fkt::cuda
