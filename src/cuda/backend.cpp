// The CUDA backend's declared support. Its chunk_kda kernels are not written yet (only the
// gate-cumsum stage exists, behind the stage test hook), so every full call is refused with a reason.
#include "cuda/backend.hpp"

#include "core/error.hpp"

namespace fkt::cuda {

bool built() { return true; }

void check_supported(const Problem&) {
  FKT_FAIL() << "q: the CUDA backend does not implement the chunk_kda forward and backward yet; "
                "run on CPU tensors (backend='cpu') until the Hopper kernels land";
}

}  // namespace fkt::cuda
