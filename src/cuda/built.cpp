// Compiled only into builds with the CUDA backend.
#include "cuda/backend.hpp"

namespace fkt::cuda {

bool built() { return true; }

}  // namespace fkt::cuda
