// The extern "C" shims: each catches every exception and turns it into a status and fkt_last_error().
#include "core/error.hpp"
#include "core/guarded.hpp"
#include "core/registry.hpp"
#include "cpu/backend.hpp"
#include "cuda/backend.hpp"
#include "flash_kda_train/c_api.h"

#ifndef FKT_VERSION
#define FKT_VERSION "0.0.0"
#endif

namespace {

fkt::Problem checked_problem(const fkt_inputs* in, const fkt_options* opt) {
  FKT_CHECK(in != nullptr && opt != nullptr) << "inputs and options must not be null";
  return fkt::make_problem(*in, *opt);
}

fkt::Problem cpu_problem(const fkt_inputs* in, const fkt_options* opt) {
  fkt::Problem p = checked_problem(in, opt);
  FKT_CHECK(p.backend == fkt::Backend::kCpu) << "q: the gold oracle runs on the CPU; got tensors on a CUDA device";
  return p;
}

}  // namespace

extern "C" {

const char* fkt_last_error(void) { return fkt::last_error.c_str(); }

const char* fkt_version(void) { return FKT_VERSION; }

int fkt_has_cuda(void) { return fkt::cuda::built() ? 1 : 0; }

int fkt_plan_sizes(const fkt_inputs* in, const fkt_options* opt, fkt_sizes* sizes) {
  return fkt::guarded([&] {
    FKT_CHECK(sizes != nullptr) << "sizes must not be null";
    const fkt::Problem p = checked_problem(in, opt);
    const fkt::BackendSizes s = fkt::plan_sizes(p);
    *sizes = {s.forward_workspace_bytes,
              s.backward_workspace_bytes,
              p.N,
              p.num_chunks,
              p.backend == fkt::Backend::kCpu ? FKT_BACKEND_CPU : FKT_BACKEND_CUDA,
              p.keep_forward ? 1 : 0,
              s.saved_bytes,
              s.saving_forward_workspace_bytes};
  });
}

int fkt_forward(const fkt_inputs* in, const fkt_options* opt, fkt_forward_outputs* out, void* stream) {
  return fkt::guarded([&] {
    FKT_CHECK(out != nullptr) << "outputs must not be null";
    const fkt::Problem p = checked_problem(in, opt);
    const fkt::BackendSizes s = fkt::plan_sizes(p);
    fkt::check_forward_outputs(p, *out, out->saved ? s.saving_forward_workspace_bytes : s.forward_workspace_bytes,
                               s.saved_bytes);
    fkt::run_forward(p, *out, stream);
  });
}

int fkt_backward(const fkt_inputs* in, const fkt_options* opt, fkt_backward_io* io, void* stream) {
  return fkt::guarded([&] {
    FKT_CHECK(io != nullptr) << "backward arguments must not be null";
    const fkt::Problem p = checked_problem(in, opt);
    const fkt::BackendSizes s = fkt::plan_sizes(p);
    fkt::check_backward_io(p, *io, s.backward_workspace_bytes, s.saved_bytes, false);
    fkt::run_backward(p, *io, stream);
  });
}

int fkt_gold_forward(const fkt_inputs* in, const fkt_options* opt, fkt_tensor* o, fkt_tensor* final_state) {
  return fkt::guarded([&] {
    const fkt::Problem p = cpu_problem(in, opt);
    fkt::check_gold_forward_outputs(p, o, final_state);
    fkt::cpu::gold_forward(p, o, final_state);
  });
}

int fkt_gold_backward(const fkt_inputs* in, const fkt_options* opt, fkt_backward_io* io) {
  return fkt::guarded([&] {
    FKT_CHECK(io != nullptr) << "backward arguments must not be null";
    const fkt::Problem p = cpu_problem(in, opt);
    fkt::check_backward_io(p, *io, 0, 0, true);
    fkt::cpu::gold_backward(p, *io);
  });
}

}  // extern "C"
