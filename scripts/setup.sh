#!/usr/bin/env bash
# Sets up everything the main job and the tests need; safe to run again (it only redoes what
# changed). Steps:
#   1. Debian packages (cmake, ninja-build, g++, ccache, libgtest-dev), installed only if missing;
#   2. the virtual environment .venv with the pins of pyproject.toml (build requirements and the
#      "test" extra);
#   3. the flash_kda_train package, built by scikit-build-core and installed (not editable) into
#      .venv, with the CUDA backend when nvcc is found;
#   4. the C++ tests, configured and built in build/ (CPU only by default).
# Environment:
#   FKT_CUDA=AUTO|ON|OFF            CUDA backend of the installed package (default AUTO)
#   FKT_CUDA_ARCHS=90a              its CUDA architectures
#   FKT_CPP_TESTS=0                 skip step 4 (and libgtest-dev)
#   FKT_CPP_TESTS_CUDA=OFF|AUTO|ON  CUDA backend in the C++ test build (default OFF)
#   FKT_SANITIZE=ON|OFF             AddressSanitizer and UBSan in the CPU-only C++ test build (default ON)
#   FKT_NO_VENV=1                   use python3 as it is: no apt, no venv, no downloads
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$FKT_ROOT"

# No CCACHE_BASEDIR: it would rewrite the absolute paths that -fmacro-prefix-map strips, and
# error messages would name ../../src/... instead of src/....
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off PIP_ROOT_USER_ACTION=ignore

debian_packages() {
  local wanted=(cmake ninja-build g++ ccache) missing=()
  [[ "${FKT_CPP_TESTS:-1}" == 0 ]] || wanted+=(libgtest-dev)
  python3 -c 'import ensurepip, venv' 2>/dev/null || wanted+=(python3-venv)
  for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  if [[ ${#missing[@]} == 0 ]]; then
    echo "Debian packages present: ${wanted[*]}"
    return
  fi
  echo "installing Debian packages: ${missing[*]}"
  local sudo=()
  [[ $(id -u) == 0 ]] || sudo=(sudo)
  "${sudo[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# The pins: build-system.requires plus the "test" extra of pyproject.toml.
pins() {
  "$FKT_PY" - <<'PY'
import tomllib
with open("pyproject.toml", "rb") as f:
    meta = tomllib.load(f)
print("\n".join(meta["build-system"]["requires"] + meta["project"]["optional-dependencies"]["test"]))
PY
}

python_env() {
  if [[ -x .venv/bin/python ]] && ! .venv/bin/python -c 'import sys' 2>/dev/null; then
    echo ".venv is broken (made on another machine?): making it again"
    rm -rf .venv
  fi
  [[ -x .venv/bin/python ]] || python3 -m venv .venv
  local requirements
  requirements="$(mktemp)"
  pins >"$requirements"
  echo "pins: $(tr '\n' ' ' <"$requirements")"
  "$FKT_PY" -m pip install -q -r "$requirements"
  rm -f "$requirements"
  "$FKT_PY" -m pip list --format=freeze 2>/dev/null |
    grep -i -E '^(torch|numpy|pytest|pytest-timeout|scikit.build.core|paddlepaddle)==' | tr '\n' ' ' || true
  echo
}

# Non-editable install: the wheel's layout (flash_kda_train/libflash_kda_train.so next to the
# Python files) is exactly what is tested. No build isolation: the build uses the pinned
# scikit-build-core of the environment and needs no download.
package() {
  "$FKT_PY" -m pip install --no-build-isolation --no-deps --force-reinstall -v .
}

# CPU-only, the C++ tests run under AddressSanitizer and UBSan (FKT_SANITIZE=OFF builds them plain).
cpp_tests() {
  local cuda="${FKT_CPP_TESTS_CUDA:-OFF}" sanitize="${FKT_SANITIZE:-ON}"
  [[ "$cuda" == OFF ]] || sanitize=OFF
  cmake -S . -B build -G Ninja -DFKT_BUILD_TESTS=ON -DFKT_CUDA="$cuda" -DFKT_SANITIZE="$sanitize" \
    -DFKT_CUDA_ARCHS="${FKT_CUDA_ARCHS:-90a}"
  cmake --build build --parallel "$(nproc)"
}

if [[ "${FKT_NO_VENV:-0}" == 1 ]]; then
  echo "FKT_NO_VENV=1: using $FKT_PY as it is"
else
  step "Debian packages" debian_packages
  step "Python environment (.venv, pinned)" python_env
fi
step "flash_kda_train package (FKT_CUDA=${FKT_CUDA:-AUTO})" package
# An if, not ||: errexit must stay in force inside the step.
if [[ "${FKT_CPP_TESTS:-1}" != 0 ]]; then
  step "C++ tests build (build/, FKT_CUDA=${FKT_CPP_TESTS_CUDA:-OFF})" cpp_tests
fi
