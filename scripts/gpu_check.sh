#!/usr/bin/env bash
# One device iteration on a GPU machine, for a library built here with the CUDA backend and carried
# there (build-cuda/): the whole Python suite (GPU tests included), compute-sanitizer memcheck, the
# main job, and the benchmark of our op alone with its per-kernel breakdown. Logs and the benchmark
# JSON/markdown go to $OUT (default /tmp/fkt-gpu-check). Uses the python3 on PATH (FKT_NO_VENV=1:
# the GPU machine reaches no registry). Extra arguments go to the benchmark (e.g. --shapes; a later
# --impls ours,fla or --accuracy auto overrides the defaults here). Wheels carried in .whl/ (FLA)
# are installed to a scratch folder on PYTHONPATH, and FLA's autotuning results kept in the tree,
# benchmarks/fla_autotune/*.tgz, are unpacked into the Triton cache and packed back, with the new
# ones, into $OUT/triton_autotune.tgz (benchmarks/README.md). It writes eight files into $OUT, the
# most the device tool brings back: with other files beside them, pack the folder. Exits non-zero
# when a test, memcheck or the main job fails.
set -uo pipefail
export FKT_NO_VENV=1 FKT_SKIP_SETUP=1
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$FKT_ROOT"
OUT="${OUT:-/tmp/fkt-gpu-check}"
mkdir -p "$OUT"
export PYTHONPATH="$FKT_ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
export FLASH_KDA_TRAIN_LIBRARY="${FLASH_KDA_TRAIN_LIBRARY:-$FKT_ROOT/build-cuda/libflash_kda_train.so}"
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/tmp/triton-cache}"
if compgen -G ".whl/*.whl" > /dev/null; then
  "$FKT_PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/fkt-site \
    .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/fkt-site"
fi
mkdir -p "$TRITON_CACHE_DIR"
for f in benchmarks/fla_autotune/*.tgz; do [[ -f "$f" ]] && tar xzf "$f" -C "$TRITON_CACHE_DIR"; done

failed=()
step "Python tests (GPU included)" "$FKT_PY" -m pytest tests/python -q -rs 2>&1 | tee "$OUT/pytest.log" | tail -15
[[ ${PIPESTATUS[0]} == 0 ]] || failed+=(pytest)
step "memcheck" bash scripts/memcheck.sh 2>&1 | tee "$OUT/memcheck.log" | tail -3
[[ ${PIPESTATUS[0]} == 0 ]] || failed+=(memcheck)
step "main job" bash scripts/run_main.sh 2>&1 | tee "$OUT/main.log" | tail -3
[[ ${PIPESTATUS[0]} == 0 ]] || failed+=(main)
step "benchmark" "$FKT_PY" -m flash_kda_train.bench --impls ours --profile --accuracy off \
  --out "$OUT/bench.json" "$@" > "$OUT/bench.log" 2>&1 || failed+=(bench)
sed -n '/^| shape/,/^$/p' "$OUT/bench.md" 2>/dev/null
(cd "$TRITON_CACHE_DIR" && find . -name '*.autotune.json' | tar czf "$OUT/triton_autotune.tgz" -T -)

if [[ ${#failed[@]} != 0 ]]; then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "gpu check passed; logs in $OUT"
