"""Describes framework tensors to the C ABI without copying them (the DLPack tensor layout).

A call's tensors are described together in one buffer (``Block``), packed with ``struct``: building
one ctypes object per tensor, shape and stride array took about 15 us a tensor on the GPU machine's
host, and the GPU waits for that before a call's first kernel.
"""

from __future__ import annotations

import ctypes
import struct
from typing import NamedTuple, Optional, Sequence, Tuple

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


class Fields(NamedTuple):
    """What the C ABI reads of one tensor (fkt_tensor in c_api.h, without the pointers)."""

    data: int  # 0 for an empty tensor
    device_type: int
    device_id: int
    code: int
    bits: int
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]


# fkt_tensor: data, device {type, id}, ndim, dtype {code, bits, lanes}, shape, strides, byte_offset;
# its shape and stride arrays follow it (one cell each for a 0-d tensor).
_TENSOR_FORMAT, _TENSOR_BYTES = "QiiiBBHQQQ", 48
_LAYOUTS = {}  # the tensors' ndims (None where absent) -> (buffer type, Struct, each tensor's offset or 0)
_NO_CELLS = (0,)  # the one shape and stride cell of a 0-d tensor
_SHAPE = Fields._fields.index("shape")  # read by index in Block's packing loop


def _layout(ndims: Tuple[Optional[int], ...]):
    formats, at, offsets = ["=", f"{len(ndims)}Q"], 8 * len(ndims), []
    for ndim in ndims:
        offsets.append(0 if ndim is None else at)  # 0 is the table's own offset: never a tensor's
        if ndim is not None:
            cells = max(ndim, 1)
            formats.append(f"{_TENSOR_FORMAT}{2 * cells}q")
            at += _TENSOR_BYTES + 16 * cells
    packer = struct.Struct("".join(formats))
    assert packer.size == at
    layout = _LAYOUTS[ndims] = (ctypes.c_char * at, packer, tuple(offsets))
    return layout


class Block:
    """fkt_tensor descriptions of several tensors (None where absent) in one buffer, led by the table
    of their addresses (NULL where absent): the layout of the ABI's fkt_inputs,
    fkt_forward_outputs and fkt_backward_io, so ``address`` is such a struct's pointer. One
    ``struct`` call packs it all; the GPU waits for this before a call's first kernel, hence the
    plain loops."""

    __slots__ = ("_buffer", "address", "_at", "fields")

    def __init__(self, fields: Sequence[Optional[Fields]]):
        ndims = tuple([None if f is None else len(f[_SHAPE]) for f in fields])
        buffer_type, packer, offsets = _LAYOUTS.get(ndims) or _layout(ndims)
        self._buffer = buffer_type()
        base = self.address = ctypes.addressof(self._buffer)
        self.fields = fields
        self._at = [base + at if at else 0 for at in offsets]
        values = self._at[:]
        for f, at in zip(fields, self._at):
            if f is not None:
                data, device_type, device_id, code, bits, shape, strides = f
                ndim = len(shape)
                at += _TENSOR_BYTES
                values += (data, device_type, device_id, ndim, code, bits, 1, at, at + 8 * (ndim or 1), 0)
                values += shape or _NO_CELLS
                values += strides or _NO_CELLS
        packer.pack_into(self._buffer, 0, *values)

    def tensor(self, i: int) -> Optional[int]:
        """The address of tensor i's fkt_tensor, None where absent."""
        return self._at[i] or None


_TORCH_CODES = {}  # torch.dtype -> (DLPack type code, bits)
_new_tuple = tuple.__new__


def describe_torch(t) -> Fields:
    """Describes a torch tensor (any strides) for the C ABI."""
    dtype = t.dtype
    codes = _TORCH_CODES.get(dtype)
    if codes is None:
        codes = _TORCH_CODES[dtype] = _codes(str(dtype).replace("torch.", ""), dtype.is_floating_point,
                                             t.element_size())
    if t.is_cuda:
        device_type, device_id = _lib.DEVICE_CUDA, t.get_device()
    elif t.is_cpu:
        device_type, device_id = _lib.DEVICE_CPU, 0
    else:
        raise ValueError(f"expected a CPU or CUDA tensor, got one on {t.device}")
    # tuple.__new__ skips the named tuple's Python-level constructor; torch.Size is a tuple.
    return _new_tuple(Fields, (t.data_ptr(), device_type, device_id, codes[0], codes[1], t.shape, t.stride()))


def describe_paddle(t) -> Fields:
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
    return Fields(data or 0, device_type, device_id, code, bits, shape, tuple(strides))
