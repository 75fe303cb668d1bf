// Carves typed arrays out of one caller-owned byte buffer. With a null base it only measures,
// so sizing and carving share one layout function and cannot drift apart.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fkt {

class Carver {
 public:
  static constexpr size_t kAlign = 64;  // a cache line; also keeps every array vector-aligned
  // What the base must be aligned to: the widest access into a carved array (float4, double).
  static constexpr size_t kBaseAlign = 16;

  explicit Carver(void* base = nullptr) : base_(static_cast<char*>(base)) {}

  // bytes rounded up to kAlign: where the next carved array starts.
  static constexpr size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

  template <typename T>
  T* take(int64_t count) {
    offset_ = aligned(offset_);
    T* result = base_ ? reinterpret_cast<T*>(base_ + offset_) : nullptr;
    offset_ += static_cast<size_t>(count) * sizeof(T);
    return result;
  }
  size_t bytes() const { return aligned(offset_); }

 private:
  char* base_;
  size_t offset_ = 0;
};

}  // namespace fkt
