// Checked CUDA runtime calls: a failure throws fkt::Error with file:line, the call and CUDA's message.
#pragma once

#include <cuda_runtime.h>

#include "core/error.hpp"

#define FKT_CUDA_CHECK(call)                                                                  \
  do {                                                                                        \
    const cudaError_t fkt_cuda_status_ = (call);                                              \
    FKT_CHECK(fkt_cuda_status_ == cudaSuccess)                                                \
        << #call << " failed: " << cudaGetErrorName(fkt_cuda_status_) << " ("                 \
        << cudaGetErrorString(fkt_cuda_status_) << ")";                                       \
  } while (0)
