"""Describes framework tensors to the C ABI without copying them (the DLPack tensor layout)."""

from __future__ import annotations

import ctypes

from . import _lib

# (DLPack type code, bits) of the dtypes the library reads; anything else is described honestly
# (for example int16 as (0, 16)) and rejected by the library with a message naming the argument.
_DTYPE_CODES = {
    "bfloat16": (4, 16),
    "float16": (2, 16),
    "float32": (2, 32),
    "float64": (2, 64),
    "int32": (0, 32),
    "int64": (0, 64),
    "uint8": (1, 8),
}


def _codes(dtype_name: str, floating: bool, element_size: int):
    """(DLPack type code, bits) of a dtype by its name: the table above, else its DLPack family
    (uint 1, complex 5, bool 6, other floats 2, other ints 0), so the library names it unsupported."""
    if dtype_name in _DTYPE_CODES:
        return _DTYPE_CODES[dtype_name]
    if dtype_name.startswith("uint"):
        code = 1
    elif dtype_name.startswith("complex"):
        code = 5
    elif dtype_name == "bool":
        code = 6
    else:
        code = 2 if floating else 0
    return code, element_size * 8


class Described:
    """An fkt_tensor for one tensor, owning the shape and stride arrays it points to."""

    __slots__ = ("struct", "_shape", "_strides", "_source")

    def __init__(self, data_ptr, device_type, device_id, dtype_code, dtype_bits, shape, strides, source):
        ndim = len(shape)
        self._shape = (ctypes.c_int64 * max(ndim, 1))(*shape)
        self._strides = (ctypes.c_int64 * max(ndim, 1))(*strides)
        self._source = source  # keeps the memory alive for the duration of the call
        self.struct = _lib.Tensor(
            data_ptr,
            _lib.Device(device_type, device_id),
            ndim,
            _lib.DType(dtype_code, dtype_bits, 1),
            self._shape,
            self._strides,
            0,
        )

    def ref(self):
        return ctypes.pointer(self.struct)


def describe_torch(t):
    """Describes a torch tensor (any strides) for the C ABI."""
    dtype_name = str(t.dtype).replace("torch.", "")
    code, bits = _codes(dtype_name, t.dtype.is_floating_point, t.element_size())
    if t.device.type == "cpu":
        device_type, device_id = _lib.DEVICE_CPU, 0
    elif t.device.type == "cuda":
        device_type, device_id = _lib.DEVICE_CUDA, t.device.index or 0
    else:
        raise ValueError(f"expected a CPU or CUDA tensor, got one on {t.device}")
    return Described(t.data_ptr() or None, device_type, device_id, code, bits, tuple(t.shape), t.stride(), t)


def pointer(described):
    """A pointer for an optional described tensor (NULL when absent)."""
    return described.ref() if described is not None else None


def describe_paddle(t):
    """Describes a contiguous paddle tensor (CPU or GPU place) for the C ABI.

    Paddle may hold a view at an offset into its allocation, so only contiguous tensors are
    accepted (callers make them contiguous); their strides are the row-major ones.
    """
    if not t.is_contiguous():
        raise ValueError("expected a contiguous paddle tensor (call .contiguous() first)")
    dtype_name = str(t.dtype).replace("paddle.", "")
    code, bits = _codes(dtype_name, t.is_floating_point(), t.element_size())
    place = t.place
    if place.is_cpu_place():
        device_type, device_id = _lib.DEVICE_CPU, 0
    elif place.is_gpu_place():
        device_type, device_id = _lib.DEVICE_CUDA, place.gpu_device_id()
    else:
        raise ValueError(f"expected a CPU or GPU paddle tensor, got one on {place}")
    shape = tuple(int(n) for n in t.shape)
    strides, step = [0] * len(shape), 1
    for axis in reversed(range(len(shape))):
        strides[axis] = step
        step *= max(shape[axis], 1)
    data = t.data_ptr() if 0 not in shape else 0
    return Described(data or None, device_type, device_id, code, bits, shape, strides, t)
