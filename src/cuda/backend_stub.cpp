// The CUDA backend as seen by a build without nvcc.
#include "core/error.hpp"
#include "cuda/backend.hpp"

namespace fkt::cuda {

bool built() { return false; }

void check_supported(const Problem&) {
  FKT_FAIL() << "q: the tensors are on a CUDA device, but this build of flash_kda_train has no CUDA "
                "backend (nvcc was not found when it was built); move the tensors to the CPU or rebuild "
                "with the CUDA toolkit";
}

void fwd_gate_cumsum(const Problem&, const fkt_tensor*, float*, void*) {
  FKT_FAIL() << "g: the tensors are on a CUDA device, but this build of flash_kda_train has no CUDA "
                "backend, so the CUDA gate-cumsum stage cannot run; rebuild with the CUDA toolkit";
}

}  // namespace fkt::cuda
