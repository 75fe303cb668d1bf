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
    return {s.forward_workspace_bytes, s.backward_workspace_bytes, 0};
  }
  FKT_FAIL() << "unreachable: the CUDA backend accepted a problem it cannot size";
}

void run_forward(const Problem& p, const fkt_forward_outputs& out, void* /*stream*/) {
  if (p.backend == Backend::kCpu) return cpu::forward(p, out);
  FKT_FAIL() << "unreachable: the CUDA backend accepted a forward it cannot run";
}

void run_backward(const Problem& p, const fkt_backward_io& io, void* /*stream*/) {
  if (p.backend == Backend::kCpu) return cpu::backward(p, io);
  FKT_FAIL() << "unreachable: the CUDA backend accepted a backward it cannot run";
}

}  // namespace fkt
