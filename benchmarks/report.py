#!/usr/bin/env python3
"""Regenerates the markdown table and the PNG plot of a benchmark result:

    python benchmarks/report.py benchmarks/results/<date>.json [--md FILE] [--png FILE] [--no-png]

Same as ``python -m flash_kda_train bench --report FILE.json``, but needs neither the built
library nor a GPU: it loads python/flash_kda_train/bench.py by its path (torch must be importable;
matplotlib for the PNG).
"""

import importlib.util
import pathlib
import sys

_BENCH = pathlib.Path(__file__).resolve().parents[1] / "python" / "flash_kda_train" / "bench.py"


def _load_bench():
    spec = importlib.util.spec_from_file_location("flash_kda_train_bench_report", _BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    sys.exit(_load_bench().report_main(sys.argv[1:]))
