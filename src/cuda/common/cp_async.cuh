// Asynchronous global-to-shared copies (cp.async, sm_80+): a stage enqueues the next chunk's
// operands while it computes on the current ones, so the sequential state passes do not wait on
// memory latency every chunk. PTX ISA, "cp.async": a src-size below the copy size zero-fills the
// rest; groups complete in the order they were committed.
#pragma once

#include <cstdint>

namespace fkt::cuda {

template <int kBytes>
__device__ __forceinline__ void cp_async(float* dst, const float* src, bool valid) {
  const auto to = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(to), "l"(src), "n"(kBytes),
               "r"(valid ? kBytes : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Enqueues (by the whole block) the copy of a [rows, cols] block of fp32 rows with global row
// stride `stride` floats into shared memory with row stride ld, zero-filling rows >= valid_rows and
// columns >= valid_cols. 16-byte copies when every row start is 16-byte aligned, else 4-byte ones.
__device__ __forceinline__ void copy_rows_async(float* dst, int ld, const float* src, int64_t stride, int rows,
                                                int cols, int valid_rows, int valid_cols) {
  const bool vector = stride % 4 == 0 && ld % 4 == 0 && cols % 4 == 0 && valid_cols % 4 == 0 &&
                      reinterpret_cast<uintptr_t>(src) % 16 == 0;
  if (vector) {
    const int quads = cols / 4;
    for (int x = threadIdx.x; x < rows * quads; x += blockDim.x) {
      const int r = x / quads, c = x % quads * 4;
      const bool in = r < valid_rows && c < valid_cols;
      cp_async<16>(dst + r * ld + c, in ? src + r * stride + c : src, in);
    }
    return;
  }
  for (int x = threadIdx.x; x < rows * cols; x += blockDim.x) {
    const int r = x / cols, c = x % cols;
    const bool in = r < valid_rows && c < valid_cols;
    cp_async<4>(dst + r * ld + c, in ? src + r * stride + c : src, in);
  }
}

}  // namespace fkt::cuda
