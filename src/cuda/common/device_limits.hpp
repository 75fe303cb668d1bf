// What the launch plans read of a device, queried from the driver once per device and kept: the
// run path asks no attribute per call.
#pragma once

#include <mutex>

#include <cuda_runtime.h>

#include "cuda/common/check.cuh"

namespace fkt::cuda {

struct DeviceLimits {
  int sms = 0;                      // streaming multiprocessors
  int smem_per_sm = 0;              // shared memory per SM, bytes
  int reserved_smem_per_block = 0;  // of it, what the system takes per resident block
  int major = 0, minor = 0;         // compute capability
};

inline const DeviceLimits& device_limits(int device) {
  constexpr int kMaxDevices = 64;
  static std::once_flag queried[kMaxDevices];
  static DeviceLimits limits[kMaxDevices];
  FKT_CHECK(device >= 0 && device < kMaxDevices)
      << "the CUDA backend supports device ordinals 0 to " << kMaxDevices - 1 << ", got cuda:" << device;
  std::call_once(queried[device], [device] {
    DeviceLimits& l = limits[device];
    FKT_CUDA_CHECK(cudaDeviceGetAttribute(&l.sms, cudaDevAttrMultiProcessorCount, device));
    FKT_CUDA_CHECK(cudaDeviceGetAttribute(&l.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
    FKT_CUDA_CHECK(cudaDeviceGetAttribute(&l.reserved_smem_per_block, cudaDevAttrReservedSharedMemoryPerBlock, device));
    FKT_CUDA_CHECK(cudaDeviceGetAttribute(&l.major, cudaDevAttrComputeCapabilityMajor, device));
    FKT_CUDA_CHECK(cudaDeviceGetAttribute(&l.minor, cudaDevAttrComputeCapabilityMinor, device));
  });
  return limits[device];
}

}  // namespace fkt::cuda
