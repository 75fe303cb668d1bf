#include "core/registry.hpp"

#include "core/error.hpp"
#include "cpu/backend.hpp"
#include "cuda/backend.hpp"

namespace fkt {

void check_supported(const Problem& p) {
  if (p.backend == Backend::kCpu) return;  // the CPU backend covers the whole contract
  cuda::check_supported(p);
}

BackendSizes plan_sizes(const Problem& p) {
  check_supported(p);
  if (p.backend == Backend::kCpu) {
    const cpu::Sizes s = cpu::plan_sizes(p);
    return {s.forward_workspace_bytes, s.backward_workspace_bytes, 0, s.forward_workspace_bytes};
  }
  return {cuda::forward_workspace_bytes(p, false), cuda::backward_workspace_bytes(p), cuda::saved_bytes(p),
          cuda::forward_workspace_bytes(p, true)};
}

void run_forward(const Problem& p, const fkt_forward_outputs& out, void* stream) {
  if (p.backend == Backend::kCpu) return cpu::forward(p, out);
  cuda::forward(p, out, stream);
}

void run_backward(const Problem& p, const fkt_backward_io& io, void* stream) {
  if (p.backend == Backend::kCpu) return cpu::backward(p, io);
  cuda::backward(p, io, stream);
}

}  // namespace fkt
