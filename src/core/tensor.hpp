// A checked, typed view of an fkt_tensor (the DLPack tensor of the C ABI).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flash_kda_train/c_api.h"

namespace fkt {

enum class DType { kBF16, kF16, kF32, kF64, kI32, kI64, kU8, kUnsupported };

DType dtype_of(const fkt_tensor& t);
const char* dtype_name(DType d);
bool is_float(DType d);
int dtype_bytes(DType d);

// Shape and element strides of one tensor, with its name for error messages.
struct TensorRef {
  const fkt_tensor* raw = nullptr;
  std::string name;
  DType dtype = DType::kUnsupported;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;

  TensorRef() = default;
  TensorRef(const fkt_tensor* t, std::string name);

  bool present() const { return raw != nullptr; }
  int ndim() const { return static_cast<int>(shape.size()); }
  int64_t numel() const;
  bool contiguous() const;
  bool on_cpu() const { return raw->device.device_type == FKT_DEVICE_CPU; }
  char* bytes() const { return static_cast<char*>(raw->data) + raw->byte_offset; }
  std::string shape_str() const;
};

std::string shape_str(const std::vector<int64_t>& shape);
bool same_device(const fkt_device& a, const fkt_device& b);
std::string device_str(const fkt_device& d);

}  // namespace fkt
