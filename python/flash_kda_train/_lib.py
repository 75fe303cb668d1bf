"""Loads libflash_kda_train and mirrors its C ABI (include/flash_kda_train/c_api.h) with ctypes.

Framework-free: tensors are described by their data pointer, device, dtype, shape and strides,
which is the DLPack tensor layout the C ABI takes.
"""

from __future__ import annotations

import ctypes
import os
import pathlib

_c_int32, _c_int64, _c_uint64 = ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64
_address = ctypes.c_void_p  # a struct or tensor description, a stream: by address, None for NULL

DEVICE_CPU, DEVICE_CUDA = 1, 2
BACKENDS = {"auto": 0, "cpu": 1, "cuda": 2}


class Options(ctypes.Structure):
    _fields_ = [
        ("scale", ctypes.c_double),
        ("lower_bound", ctypes.c_double),
        ("has_lower_bound", _c_int32),
        ("chunk_size", _c_int32),
        ("use_qk_l2norm_in_kernel", _c_int32),
        ("use_gate_in_kernel", _c_int32),
        ("use_beta_sigmoid_in_kernel", _c_int32),
        ("allow_neg_eigval", _c_int32),
        ("safe_gate", _c_int32),
        ("disable_recompute", _c_int32),
        ("state_v_first", _c_int32),
        ("backend", _c_int32),
        ("forward_pieces", _c_int32),
    ]


# The tensor arguments of a call are described by one ``_tensors.Block``, whose table of fkt_tensor
# (DLTensor) pointers, in these orders, is the ABI's fkt_inputs, fkt_forward_outputs and
# fkt_backward_io; they and single tensors are passed by address (c_void_p).
INPUT_NAMES = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "cu_seqlens", "cu_seqlens_cpu")
FORWARD_OUTPUT_NAMES = ("o", "final_state", "intermediate_states", "workspace", "saved")
GRAD_NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias", "dh0")
BACKWARD_IO_NAMES = ("d_o", "d_final_state", *GRAD_NAMES, "workspace", "saved")


class Sizes(ctypes.Structure):
    _fields_ = [
        ("forward_workspace_bytes", _c_uint64),
        ("backward_workspace_bytes", _c_uint64),
        ("num_sequences", _c_int64),
        ("num_chunks", _c_int64),
        ("backend", _c_int32),
        ("backward_reads_forward_workspace", _c_int32),
        ("saved_bytes", _c_uint64),
        ("saving_forward_workspace_bytes", _c_uint64),
    ]


def _candidates():
    env = os.environ.get("FLASH_KDA_TRAIN_LIBRARY")
    if env:
        yield pathlib.Path(env)
        return
    here = pathlib.Path(__file__).resolve().parent
    yield here / "libflash_kda_train.so"
    root = here.parent.parent  # a source checkout: python/flash_kda_train -> repository root
    for build in ("build", "build-cuda"):
        yield root / build / "libflash_kda_train.so"


def _load():
    tried = []
    for path in _candidates():
        if path.is_file():
            return ctypes.CDLL(str(path))
        tried.append(str(path))
    raise ImportError(
        "flash_kda_train: libflash_kda_train.so not found (looked at " + ", ".join(tried) + "); "
        "install the package (pip install .) or set FLASH_KDA_TRAIN_LIBRARY"
    )


lib = _load()
lib.fkt_last_error.restype = ctypes.c_char_p
lib.fkt_version.restype = ctypes.c_char_p
lib.fkt_has_cuda.restype = ctypes.c_int
for _name, _args in {
    "fkt_plan_sizes": [_address, ctypes.POINTER(Options), ctypes.POINTER(Sizes)],
    "fkt_forward": [_address, ctypes.POINTER(Options), _address, _address],
    "fkt_backward": [_address, ctypes.POINTER(Options), _address, _address],
    "fkt_gold_forward": [_address, ctypes.POINTER(Options), _address, _address],
    "fkt_gold_backward": [_address, ctypes.POINTER(Options), _address],
    "fkt_stage_gate_cumsum": [_address, ctypes.POINTER(Options), _address, _address],
}.items():
    getattr(lib, _name).argtypes = _args
    getattr(lib, _name).restype = ctypes.c_int


# Context parallelism (the end of c_api.h).
class CpSizes(ctypes.Structure):
    _fields_ = [
        ("forward_summary_workspace_bytes", _c_uint64),
        ("backward_summary_workspace_bytes", _c_uint64),
        ("backend", _c_int32),
    ]


CP_FORWARD, CP_BACKWARD = 0, 1
for _name, _args in {
    "fkt_cp_plan_sizes": [_address, ctypes.POINTER(Options), ctypes.POINTER(CpSizes)],
    "fkt_cp_forward_summary": [_address, ctypes.POINTER(Options), _c_int64, _address, _address, _address],
    "fkt_cp_backward_summary": [_address, ctypes.POINTER(Options), _address, _c_int64, _address, _address, _address],
    "fkt_cp_fold": [_address, _c_int64, _c_int64, _c_int32, _c_int32, _address, _address],
}.items():
    getattr(lib, _name).argtypes = _args
    getattr(lib, _name).restype = ctypes.c_int


def check(status: int) -> None:
    """Raises the library's error (file:line: message) as a ValueError."""
    if status != 0:
        raise ValueError(lib.fkt_last_error().decode())


def version() -> str:
    return lib.fkt_version().decode()


def has_cuda() -> bool:
    return bool(lib.fkt_has_cuda())
