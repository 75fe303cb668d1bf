# Sourced by the scripts in this folder: the repository root, the Python to use and a timer.
# FKT_NO_VENV=1 uses the python3 on PATH as it is (no apt, no venv, no downloads), for machines
# that cannot reach the package registries but already hold the packages (the GPU machine).

FKT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ "${FKT_NO_VENV:-0}" == 1 ]]; then
  FKT_PY="$(command -v python3)"
else
  FKT_PY="$FKT_ROOT/.venv/bin/python"
fi

# step NAME COMMAND...: runs COMMAND (a function too: in a subshell with errexit, so its first
# failing command stops it), then prints how long it took; returns COMMAND's status.
step() {
  local name="$1" start=$SECONDS status=0 errexit=0
  shift
  [[ $- == *e* ]] && errexit=1
  echo "==> $name"
  set +e
  (set -e; "$@")
  status=$?
  [[ $errexit == 0 ]] || set -e
  echo "<== $name: $((SECONDS - start)) s$([[ $status == 0 ]] || echo ", FAILED (exit $status)")"
  return "$status"
}
