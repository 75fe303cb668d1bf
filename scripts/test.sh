#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs every test: the C++ tests (ctest) and the Python tests
# (pytest), both against the CPU backend when there is no GPU. Exits non-zero when a test fails,
# when a suite ran no test, or when the setup fails. Extra arguments go to pytest.
# FKT_SKIP_SETUP=1 runs the tests on what the last setup built.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$FKT_ROOT"

[[ "${FKT_SKIP_SETUP:-0}" == 1 ]] || bash scripts/setup.sh

failed=()
if [[ "${FKT_CPP_TESTS:-1}" != 0 ]]; then
  step "C++ tests (ctest)" ctest --test-dir build --output-on-failure --no-tests=error || failed+=(ctest)
fi
# pytest exits 5 when it collected no test, which counts as a failure here like any non-zero exit.
step "Python tests (pytest)" "$FKT_PY" -m pytest tests/python -q "$@" || failed+=(pytest)

if [[ ${#failed[@]} != 0 ]]; then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "all tests passed"
