// Context parallelism on the CPU backend (kda-math.md section 9): the forward and backward summaries
// of one sequence as affine maps of its entering state / leaving-state gradient, and their fold.
#pragma once

#include <cstdint>

#include "core/problem.hpp"
#include "flash_kda_train/c_api.h"

namespace fkt::cpu {

struct CpSizes {
  uint64_t forward_summary_workspace_bytes;
  uint64_t backward_summary_workspace_bytes;
};

CpSizes cp_plan_sizes(const Problem& p);

// summary: contiguous [HV, K, V + K] of p.state_dtype(); workspace: cp_plan_sizes(p) bytes, carved
// per thread. `sequence` indexes p.sequences.
void cp_forward_summary(const Problem& p, int64_t sequence, char* summary, char* workspace);
void cp_backward_summary(const Problem& p, const fkt_tensor* d_o, int64_t sequence, char* summary,
                         char* workspace);

// summaries: contiguous [R, HV, K, V + K]; state: contiguous [HV, K, V] ([HV, V, K] if state_v_first).
// Folds ranks first .. first + count - 1 (forward: in order; backward: last to first), see fkt_cp_fold.
template <typename Real>
void cp_fold(const Real* summaries, int64_t HV, int64_t K, int64_t V, int64_t first, int64_t count, bool backward,
             bool state_v_first, Real* state);

}  // namespace fkt::cpu
