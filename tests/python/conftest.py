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
