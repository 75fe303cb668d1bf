#!/usr/bin/env bash
# compute-sanitizer memcheck (out-of-bounds and misaligned accesses, leaks of device errors) over the
# CUDA forward and backward on the small shapes of tests/memcheck/cases.py. Needs a GPU and a
# library built with the CUDA backend; exits non-zero on any sanitizer error or non-finite output.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$FKT_ROOT"
# Without torch's caching allocator every buffer (a workspace among them) is an allocation of its
# own, so an access past its end is reported instead of landing in a cached neighbour.
PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH="$FKT_ROOT/python${PYTHONPATH:+:$PYTHONPATH}" \
  compute-sanitizer --tool memcheck --error-exitcode 1 "$FKT_PY" tests/memcheck/cases.py
