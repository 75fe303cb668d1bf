#!/usr/bin/env bash
# Several builds of the library against one base, in one device call (on the GPU machine, the
# libraries carried; benchmarks/README.md): for each VARIANT, benchmarks/ab.py --bits against BASE
# (every output and gradient of scripts/bitdump.py's calls compared bit for bit, then the benchmark
# of our op, rounds alternating A and B) into $OUT/ab-NAME.md, NAME being the variant's file name
# without .so; with CHECK=1 also the CUDA tests and memcheck with that variant. An A/B of four
# shapes took about 50 s on an H100 (2026-12-07), so one 600 s call holds several. Each step's exit
# status, time and the tests' last lines go to $OUT/run.log; the most files the device tool returns
# is eight, so at most seven variants. Environment: SHAPES, ROUNDS (else ab.py's default), CHECK
# (0), AB_TIMEOUT (230 s).
#
#     bash scripts/device_ab.sh build-var/main.so build-var/variant-a.so build-var/variant-b.so
set -uo pipefail
export FKT_NO_VENV=1 FKT_SKIP_SETUP=1
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$FKT_ROOT"
if [[ $# -lt 2 ]]; then
  echo "usage: bash scripts/device_ab.sh BASE.so VARIANT.so [VARIANT.so ...]" >&2
  exit 2
fi
OUT="${OUT:-/tmp/fkt-device-ab}"
mkdir -p "$OUT"
export PYTHONPATH="$FKT_ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/tmp/triton-cache}"
shapes="${SHAPES:-B1_T8192_H96,B2_T16384_H16,B4_T2048_H16,gva_B2_T8192_H16_HV64}"
base="$(realpath "$1")"
shift
log="$OUT/run.log"
nvidia-smi --query-gpu=name --format=csv,noheader > "$log" 2>&1
start=$SECONDS
failed=0
for variant in "$@"; do
  lib="$(realpath "$variant")"
  name="$(basename "$lib" .so)"
  echo "== ab-$name at $((SECONDS - start)) s" >> "$log"
  timeout "${AB_TIMEOUT:-230}" "$FKT_PY" benchmarks/ab.py --bits --a "$base" --b "$lib" --shapes "$shapes" \
    --out "/tmp/ab-$name" ${ROUNDS:+--rounds "$ROUNDS"} -- --warmup 2 --reps 10 > "$OUT/ab-$name.md" 2>&1
  status=$?
  echo "ab exit $status at $((SECONDS - start)) s" >> "$log"
  [[ $status == 0 ]] || failed=1
  [[ "${CHECK:-0}" == 1 ]] || continue
  echo "== tests and memcheck with $name" >> "$log"
  FLASH_KDA_TRAIN_LIBRARY="$lib" "$FKT_PY" -m pytest -q -x tests/python/test_cuda_backward.py \
    tests/python/test_cuda_forward.py tests/python/test_cuda_forward_pieces.py tests/python/test_chunk_kda_vs_gold.py \
    > "/tmp/pytest-$name.log" 2>&1
  status=$?
  tail -3 "/tmp/pytest-$name.log" >> "$log"
  echo "pytest exit $status at $((SECONDS - start)) s" >> "$log"
  [[ $status == 0 ]] || failed=1
  FLASH_KDA_TRAIN_LIBRARY="$lib" bash scripts/memcheck.sh > "/tmp/memcheck-$name.log" 2>&1
  status=$?
  tail -2 "/tmp/memcheck-$name.log" >> "$log"
  echo "memcheck exit $status at $((SECONDS - start)) s" >> "$log"
  [[ $status == 0 ]] || failed=1
done
exit "$failed"
