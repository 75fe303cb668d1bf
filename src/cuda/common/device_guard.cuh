// Makes the inputs' device current for the launches of one call and restores the caller's device
// afterwards, so a stream of cuda:1 is never used while cuda:0 is current.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/check.cuh"

namespace fkt::cuda {

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    FKT_CUDA_CHECK(cudaGetDevice(&previous_));
    if (device != previous_) FKT_CUDA_CHECK(cudaSetDevice(device));
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  // A destructor must not throw; setting back a device that was current a moment ago cannot fail.
  ~DeviceGuard() { (void)cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

}  // namespace fkt::cuda
