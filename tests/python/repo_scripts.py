"""The repository's scripts (benchmarks/, scripts/), loaded by path as modules for their tests."""

import importlib.util
import pathlib

_ROOT = pathlib.Path(__file__).resolve().parents[2]


def load(relative_path: str):
    """The module of the file at relative_path under the repository root, executed once."""
    path = _ROOT / relative_path
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
