import pathlib
import sys

import pytest
import torch

# Run from a source checkout without installing: python/ holds the package, build/ the library.
_PYTHON = pathlib.Path(__file__).resolve().parents[2] / "python"
try:
    import flash_kda_train  # noqa: F401
except ImportError:
    sys.path.insert(0, str(_PYTHON))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def poisoned(monkeypatch):
    """Every buffer the torch adapter allocates with torch.empty starts as NaN (floats) or 0xFF bytes
    (workspace), so an element a kernel never writes shows up as NaN."""
    from flash_kda_train import _core

    real_empty = torch.empty

    def empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        if t.dtype == torch.uint8:
            t.fill_(255)  # as fp32 words: NaN
        elif t.is_floating_point():
            t.fill_(float("nan"))
        return t

    monkeypatch.setattr(_core.torch, "empty", empty)
