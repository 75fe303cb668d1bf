#include "core/tensor.hpp"

#include <sstream>

#include "core/error.hpp"

namespace fkt {

DType dtype_of(const fkt_tensor& t) {
  if (t.dtype.lanes != 1) return DType::kUnsupported;
  switch (t.dtype.code) {
    case FKT_DTYPE_BFLOAT:
      return t.dtype.bits == 16 ? DType::kBF16 : DType::kUnsupported;
    case FKT_DTYPE_FLOAT:
      if (t.dtype.bits == 16) return DType::kF16;
      if (t.dtype.bits == 32) return DType::kF32;
      if (t.dtype.bits == 64) return DType::kF64;
      return DType::kUnsupported;
    case FKT_DTYPE_INT:
      if (t.dtype.bits == 32) return DType::kI32;
      if (t.dtype.bits == 64) return DType::kI64;
      return DType::kUnsupported;
    case 1:  // DLPack kDLUInt
      return t.dtype.bits == 8 ? DType::kU8 : DType::kUnsupported;
    default:
      return DType::kUnsupported;
  }
}

const char* dtype_name(DType d) {
  switch (d) {
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
    case DType::kF32: return "float32";
    case DType::kF64: return "float64";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
    case DType::kU8: return "uint8";
    default: return "an unsupported dtype";
  }
}

bool is_float(DType d) {
  return d == DType::kBF16 || d == DType::kF16 || d == DType::kF32 || d == DType::kF64;
}

int dtype_bytes(DType d) {
  switch (d) {
    case DType::kBF16:
    case DType::kF16: return 2;
    case DType::kF32:
    case DType::kI32: return 4;
    case DType::kF64:
    case DType::kI64: return 8;
    case DType::kU8: return 1;
    default: return 0;
  }
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  s << "]";
  return s.str();
}

bool same_device(const fkt_device& a, const fkt_device& b) {
  return a.device_type == b.device_type && a.device_id == b.device_id;
}

std::string device_str(const fkt_device& d) {
  if (d.device_type == FKT_DEVICE_CPU) return "cpu";
  if (d.device_type == FKT_DEVICE_CUDA) return "cuda:" + std::to_string(d.device_id);
  return "device type " + std::to_string(d.device_type);
}

TensorRef::TensorRef(const fkt_tensor* t, std::string n) : raw(t), name(std::move(n)) {
  if (t == nullptr) return;
  FKT_CHECK(t->ndim >= 0 && t->ndim <= 8) << name << ": expected at most 8 dimensions, got " << t->ndim;
  FKT_CHECK(t->ndim == 0 || t->shape != nullptr) << name << ": shape pointer is null";
  dtype = dtype_of(*t);
  shape.assign(t->shape, t->shape + t->ndim);
  for (int64_t extent : shape) FKT_CHECK(extent >= 0) << name << ": negative extent in shape " << fkt::shape_str(shape);
  strides.resize(t->ndim);
  int64_t running = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    strides[i] = t->strides ? t->strides[i] : running;
    running *= shape[i];
  }
  FKT_CHECK(numel() == 0 || t->data != nullptr) << name << ": data pointer is null";
}

int64_t TensorRef::numel() const {
  int64_t n = 1;
  for (int64_t extent : shape) n *= extent;
  return n;
}

bool TensorRef::contiguous() const {
  if (numel() == 0) return true;  // no element, so no layout (a T = 0 call's tensors)
  int64_t running = 1;
  for (int i = ndim() - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != running) return false;
    running *= shape[i];
  }
  return true;
}

std::string TensorRef::shape_str() const { return fkt::shape_str(shape); }

}  // namespace fkt
