"""The tensor descriptions (_tensors.Block: DLPack exports and their table) read back through
ctypes mirrors of c_api.h's fkt_tensor and its pointer tables: every field, absent tensors as NULL,
0-d tensors, strided views and views at an offset; the errors of tensors that cannot be described."""

import ctypes
import gc

import pytest
import torch
from torch.utils.dlpack import to_dlpack

from flash_kda_train import _lib
from flash_kda_train._abi import describe_all
from flash_kda_train._core import TORCH
from flash_kda_train._tensors import Block


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):  # fkt_tensor
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32), ("dtype", _DType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


def _read(address):
    t = _Tensor.from_address(address)
    return dict(data=t.data or 0, device=(t.device.device_type, t.device.device_id), ndim=t.ndim,
                dtype=(t.dtype.code, t.dtype.bits, t.dtype.lanes), shape=tuple(t.shape[i] for i in range(t.ndim)),
                strides=tuple(t.strides[i] for i in range(t.ndim)), byte_offset=t.byte_offset)


def test_sizeof_fkt_tensor_is_48():
    assert ctypes.sizeof(_Tensor) == 48


def _block(tensors):
    return Block([to_dlpack(t) if t is not None else None for t in tensors])


def test_block_table_and_fields_read_back():
    base = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    view = base.transpose(0, 2)  # strided: (1, 4, 12)
    scalar = torch.tensor(3, dtype=torch.int64)
    offset = base.view(-1)[5:17].view(3, 4)  # a view at an offset into its storage
    tensors = [view, None, scalar, torch.zeros(5, dtype=torch.bfloat16), None, offset]
    block = _block(tensors)
    table = (ctypes.c_uint64 * len(tensors)).from_address(block.address)
    for i, t in enumerate(tensors):
        if t is None:
            assert table[i] == 0 and block.tensor(i) is None
            continue
        assert table[i] == block.tensor(i)
        got = _read(table[i])
        assert got["data"] + got["byte_offset"] == t.data_ptr()
        assert got["device"] == (_lib.DEVICE_CPU, 0)
        assert got["ndim"] == t.dim()
        assert got["shape"] == tuple(t.shape) and got["strides"] == t.stride()
    assert _read(block.tensor(0))["dtype"] == (2, 32, 1)
    assert _read(block.tensor(2))["dtype"] == (0, 64, 1)
    assert _read(block.tensor(3))["dtype"] == (4, 16, 1)
    assert _read(block.tensor(0))["strides"] == (1, 4, 12)


def test_block_keeps_its_tensors_described_until_dropped():
    t = torch.arange(6, dtype=torch.float16).reshape(2, 3)
    block = _block([t.clone(), None])  # the block holds the only reference to the clone
    gc.collect()
    got = _read(block.tensor(0))
    assert got["dtype"] == (2, 16, 1) and got["shape"] == (2, 3) and block.tensor(1) is None
    read = (ctypes.c_uint16 * 6).from_address(got["data"] + got["byte_offset"])
    assert torch.equal(torch.tensor(list(read), dtype=torch.int16).view(torch.float16).view(2, 3), t)


def test_describing_names_the_argument_and_what_is_wrong():
    q = torch.ones(2)
    with pytest.raises(ValueError, match="k: expected a CPU or CUDA tensor, got one on meta"):
        describe_all(TORCH, ("q", "k"), (q, torch.empty(2, device="meta")))
    with pytest.raises(ValueError, match="q: expected a torch.Tensor, got list"):
        describe_all(TORCH, ("q", "k"), ([1.0], None))
    with pytest.raises(ValueError, match="k: torch cannot export it through DLPack .RuntimeError: Cannot access"):
        describe_all(TORCH, ("q", "k"), (q, torch.eye(2).to_sparse()))
