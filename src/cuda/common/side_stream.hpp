// A second stream beside the caller's, for a call that forks work off the caller's stream and joins it
// back before it returns (forward/pieces.hpp). Created on a device's first use by a host thread and
// kept by that thread: no allocation of device memory and no creation per call, and two host threads
// never share one, so that their records and waits on its events cannot interleave. Under stream
// capture the fork and the join are the capture's own edges: the side stream joins the capture with
// its first wait on a captured event and stays in it until the capture ends, so a thread that forks
// a call on another stream while a capture of its own is open gets CUDA's capture-isolation error.
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
    try {
      int least = 0, greatest = 0;
      FKT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
      FKT_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
      FKT_CUDA_CHECK(cudaEventCreateWithFlags(&forked_, cudaEventDisableTiming));
      FKT_CUDA_CHECK(cudaEventCreateWithFlags(&joined_, cudaEventDisableTiming));
    } catch (...) {
      release();
      throw;
    }
  }
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  // At a thread's exit; at the process's, the runtime may be gone already, whose errors are ignored.
  ~SideStream() { release(); }

  cudaStream_t stream() const { return stream_; }
  // What is enqueued on the side stream from now on runs after what `main` holds now.
  void follow(cudaStream_t main) const {
    FKT_CUDA_CHECK(cudaEventRecord(forked_, main));
    FKT_CUDA_CHECK(cudaStreamWaitEvent(stream_, forked_, 0));
  }
  // What is enqueued on `main` from now on runs after what the side stream holds now; CUDA's status.
  cudaError_t join(cudaStream_t main) const noexcept {
    const cudaError_t recorded = cudaEventRecord(joined_, stream_);
    return recorded != cudaSuccess ? recorded : cudaStreamWaitEvent(main, joined_, 0);
  }

 private:
  void release() {
    if (joined_ != nullptr) (void)cudaEventDestroy(joined_);
    if (forked_ != nullptr) (void)cudaEventDestroy(forked_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }

  cudaStream_t stream_ = nullptr;
  cudaEvent_t forked_ = nullptr, joined_ = nullptr;
};

// One call's fork of the side stream off `main`: the side stream follows main where the call says,
// and main waits for the side stream's work when the call joins, or when the fork goes out of scope
// unjoined (an error mid-way), so that no work of the call is left where the caller's later work
// would not wait for it, nor a capture with a stream it cannot join.
class Fork {
 public:
  Fork(const SideStream& side, cudaStream_t main) : side_(side), main_(main) {}
  Fork(const Fork&) = delete;
  Fork& operator=(const Fork&) = delete;
  // Unjoined: an error left the call, and it is the one the caller gets (this join's is ignored).
  ~Fork() {
    if (!joined_) (void)side_.join(main_);
  }

  cudaStream_t stream() const { return side_.stream(); }
  void follow() const { side_.follow(main_); }
  void join() {
    joined_ = true;
    FKT_CUDA_CHECK(side_.join(main_));
  }

 private:
  const SideStream& side_;
  cudaStream_t main_;
  bool joined_ = false;
};

}  // namespace fkt::cuda
