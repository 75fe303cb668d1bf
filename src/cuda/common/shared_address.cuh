// Shared-memory addresses: the 32-bit shared-window address that PTX's shared-state-space
// instructions take, and a dynamic shared-memory base rounded up for TMA boxes.
#pragma once

#include <cstdint>

namespace fkt::cuda {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The dynamic shared memory from `base` rounded up to kAlign bytes (a 128-byte-swizzled box needs
// 1024): the launch asks for kAlign bytes more than the layout. An offset added to `base`, so that
// the compiler still sees a shared-memory pointer and emits LDS / STS (through an integer it would
// emit generic loads and stores).
template <int kAlign>
__device__ __forceinline__ char* align_shared(char* base) {
  return base + (kAlign - shared_address(base) % kAlign) % kAlign;
}

}  // namespace fkt::cuda
