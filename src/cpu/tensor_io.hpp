// Element loads and stores with dtype conversion for the CPU backend and the gold oracle.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/tensor.hpp"

namespace fkt::cpu {

inline float bf16_to_float(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1F;
  uint32_t mantissa = h & 0x3FF;
  uint32_t bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000 | (mantissa << 13);
  } else if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int shift = 0;
      while ((mantissa & 0x400) == 0) {
        mantissa <<= 1;
        ++shift;
      }
      mantissa &= 0x3FF;
      bits = sign | (static_cast<uint32_t>(127 - 15 - shift + 1) << 23) | (mantissa << 13);
    }
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, with overflow to infinity and gradual underflow.
inline uint16_t float_to_half(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t abs_bits = bits & 0x7FFFFFFF;
  if (abs_bits >= 0x7F800000) return sign | (abs_bits > 0x7F800000 ? 0x7E00 : 0x7C00);
  if (abs_bits >= 0x477FF000) return sign | 0x7C00;  // rounds to >= 65520: infinity
  if (abs_bits < 0x38800000) {  // subnormal half: units of 2^-24, scaling by 2^24 is exact
    float magnitude;
    std::memcpy(&magnitude, &abs_bits, 4);
    return sign | static_cast<uint16_t>(std::nearbyint(magnitude * 16777216.0f));
  }
  uint32_t rebased = abs_bits - (static_cast<uint32_t>(127 - 15) << 23);
  rebased += 0xFFF + ((rebased >> 13) & 1);
  return sign | static_cast<uint16_t>(rebased >> 13);
}

template <typename Real>
inline Real load(const char* at, DType dtype) {
  switch (dtype) {
    case DType::kBF16: return static_cast<Real>(bf16_to_float(*reinterpret_cast<const uint16_t*>(at)));
    case DType::kF16: return static_cast<Real>(half_to_float(*reinterpret_cast<const uint16_t*>(at)));
    case DType::kF32: return static_cast<Real>(*reinterpret_cast<const float*>(at));
    default: return static_cast<Real>(*reinterpret_cast<const double*>(at));
  }
}

template <typename Real>
inline void store(char* at, DType dtype, Real value) {
  switch (dtype) {
    case DType::kBF16: *reinterpret_cast<uint16_t*>(at) = float_to_bf16(static_cast<float>(value)); break;
    case DType::kF16: *reinterpret_cast<uint16_t*>(at) = float_to_half(static_cast<float>(value)); break;
    case DType::kF32: *reinterpret_cast<float*>(at) = static_cast<float>(value); break;
    default: *reinterpret_cast<double*>(at) = static_cast<double>(value); break;
  }
}

// Strided element access to a float tensor of up to five dimensions (missing trailing indices are 0).
class View {
 public:
  View() = default;
  explicit View(const TensorRef& t) : dtype_(t.dtype), base_(t.present() ? t.bytes() : nullptr) {
    for (int i = 0; i < t.ndim() && i < 5; ++i) stride_bytes_[i] = t.strides[i] * dtype_bytes(t.dtype);
  }
  explicit View(const fkt_tensor* raw, const char* name) : View(TensorRef(raw, name)) {}

  bool present() const { return base_ != nullptr; }
  char* at(int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0, int64_t i4 = 0) const {
    return base_ + i0 * stride_bytes_[0] + i1 * stride_bytes_[1] + i2 * stride_bytes_[2] + i3 * stride_bytes_[3] +
           i4 * stride_bytes_[4];
  }
  template <typename Real, typename... I>
  Real get(I... index) const {
    return load<Real>(at(index...), dtype_);
  }
  template <typename Real, typename... I>
  void set(Real value, I... index) const {
    store<Real>(at(index...), dtype_, value);
  }
  // Flat element i of a contiguous tensor (A_log, dt_bias).
  template <typename Real>
  Real flat(int64_t i) const {
    return load<Real>(base_ + i * dtype_bytes(dtype_), dtype_);
  }
  template <typename Real>
  void set_flat(int64_t i, Real value) const {
    store<Real>(base_ + i * dtype_bytes(dtype_), dtype_, value);
  }

 private:
  DType dtype_ = DType::kF32;
  char* base_ = nullptr;
  int64_t stride_bytes_[5] = {0, 0, 0, 0, 0};
};

}  // namespace fkt::cpu
