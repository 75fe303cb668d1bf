#!/usr/bin/env bash
# Sets up (scripts/setup.sh, without the C++ tests) and runs the main job: one training step
# (forward + backward) of chunk_kda on the best backend present, checked against the fp64 gold.
# Extra arguments go to it (python -m flash_kda_train --help lists them).
# FKT_SKIP_SETUP=1 runs it on what the last setup built.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$FKT_ROOT"

[[ "${FKT_SKIP_SETUP:-0}" == 1 ]] || FKT_CPP_TESTS=0 bash scripts/setup.sh
step "main job" "$FKT_PY" -m flash_kda_train "$@"
