"""Describes framework tensors to the C ABI without copying them.

The ABI's fkt_tensor is DLPack's DLTensor, so a tensor is described by exporting it through its
framework's own DLPack exporter: the capsule holds a DLManagedTensor whose first member is the
DLTensor. A call's tensors go in one ``Block``: the table of their DLTensor addresses (NULL where
absent) that the ABI's fkt_inputs, fkt_forward_outputs and fkt_backward_io are. One export and one
capsule read a tensor, where packing the same fields from Python took twice as long.
"""

from __future__ import annotations

import ctypes
from typing import Any, Optional, Sequence

_CAPSULE_NAME = b"dltensor"  # an unversioned DLManagedTensor, not yet consumed
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


class Block:
    """The DLTensors of several tensors (None where absent) and the table of their addresses, so
    ``address`` is an fkt_inputs / fkt_forward_outputs / fkt_backward_io pointer. The capsules own
    the DLTensors, and each a reference to its tensor, until the block is dropped: a block lives
    for one call and references the call's tensors for that long only. The capsules are not
    consumed (DLPack's rename to "used_dltensor"), so their destructors free what they own."""

    __slots__ = ("_capsules", "_addresses", "_table", "address")

    def __init__(self, capsules: Sequence[Optional[Any]]):
        self._capsules = capsules
        self._addresses = [None if c is None else _capsule_pointer(c, _CAPSULE_NAME) for c in capsules]
        self._table = (ctypes.c_void_p * len(capsules))(*self._addresses)
        self.address = ctypes.addressof(self._table)

    def tensor(self, i: int) -> Optional[int]:
        """The address of tensor i's fkt_tensor, None where absent."""
        return self._addresses[i]
