// The backend registry: which backend runs a problem, what it supports, and its entry points.
#pragma once

#include <string>

#include "core/problem.hpp"

namespace fkt {

struct BackendSizes {
  uint64_t forward_workspace_bytes = 0;
  uint64_t backward_workspace_bytes = 0;
  uint64_t saved_bytes = 0;  // fkt_sizes.saved_bytes
  uint64_t saving_forward_workspace_bytes = 0;  // fkt_sizes.saving_forward_workspace_bytes
};

// Throws fkt::Error naming the unsupported feature when p.backend cannot run p.
void check_supported(const Problem& p);
BackendSizes plan_sizes(const Problem& p);
void run_forward(const Problem& p, const fkt_forward_outputs& out, void* stream);
void run_backward(const Problem& p, const fkt_backward_io& io, void* stream);

}  // namespace fkt
