// Entry points of the CPU backend and of the fp64 gold oracle.
#pragma once

#include "core/problem.hpp"
#include "flash_kda_train/c_api.h"

namespace fkt::cpu {

struct Sizes {
  uint64_t forward_workspace_bytes;
  uint64_t backward_workspace_bytes;
};

// Threads the CPU backend runs on; the workspace holds one scratch slot per thread.
int num_slots(const Problem& p);
Sizes plan_sizes(const Problem& p);
void forward(const Problem& p, const fkt_forward_outputs& out);
void backward(const Problem& p, const fkt_backward_io& io);

void gold_forward(const Problem& p, const fkt_tensor* o, const fkt_tensor* final_state);
void gold_backward(const Problem& p, const fkt_backward_io& io);

}  // namespace fkt::cpu
