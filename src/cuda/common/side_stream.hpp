// A second stream beside the caller's, for a call that forks work off the caller's stream and joins it
// back before it returns (forward/pieces.hpp). Created on a device's first use by a host thread and
// kept by that thread: no allocation of device memory and no creation per call, and two host threads
// never share one, so that their records and waits on its events cannot interleave. Under stream
// capture the fork and the join are the capture's own edges (the side stream joins the capture with
// its first wait on a captured event and leaves it with the join).
#pragma once

#include <map>

#include <cuda_runtime.h>

#include "cuda/common/check.cuh"

namespace fkt::cuda {

class SideStream {
 public:
  // The current device's side stream of this thread: the highest priority the device offers, so
  // that its blocks, which the fork's longer chain runs on, are scheduled first.
  static SideStream& current() {
    thread_local std::map<int, SideStream> streams;
    int device = 0;
    FKT_CUDA_CHECK(cudaGetDevice(&device));
    auto at = streams.find(device);
    if (at == streams.end()) at = streams.try_emplace(device).first;
    return at->second;
  }

  SideStream() {
    int least = 0, greatest = 0;
    FKT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    FKT_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
    FKT_CUDA_CHECK(cudaEventCreateWithFlags(&forked_, cudaEventDisableTiming));
    FKT_CUDA_CHECK(cudaEventCreateWithFlags(&joined_, cudaEventDisableTiming));
  }
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  // At a thread's exit; at the process's, the runtime may be gone already, whose errors are ignored.
  ~SideStream() {
    (void)cudaEventDestroy(joined_);
    (void)cudaEventDestroy(forked_);
    (void)cudaStreamDestroy(stream_);
  }

  cudaStream_t stream() const { return stream_; }
  // What is enqueued on the side stream from now on runs after what `main` holds now.
  void follow(cudaStream_t main) const {
    FKT_CUDA_CHECK(cudaEventRecord(forked_, main));
    FKT_CUDA_CHECK(cudaStreamWaitEvent(stream_, forked_, 0));
  }
  // What is enqueued on `main` from now on runs after what the side stream holds now.
  void join(cudaStream_t main) const {
    FKT_CUDA_CHECK(cudaEventRecord(joined_, stream_));
    FKT_CUDA_CHECK(cudaStreamWaitEvent(main, joined_, 0));
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t forked_ = nullptr, joined_ = nullptr;
};

}  // namespace fkt::cuda
