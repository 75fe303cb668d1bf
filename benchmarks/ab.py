"""A/B of two builds of the library on one machine, in one command: the benchmark of our op
(`flash_kda_train.bench --impls ours --accuracy off`) for library A, then B, each in a process of its
own (FLASH_KDA_TRAIN_LIBRARY), for --rounds rounds, the first with the per-kernel profile; then a
markdown table of each round's timed medians, the peak extra memory and every kernel's GPU time in
the profiled round, A against B. A machine's timings drift from process to process, so the rounds
alternate A and B and the table keeps every round's numbers rather than one median. With --bits,
scripts/bitdump.py first dumps every output and gradient of its fixed calls with each library and
compares them bit for bit (CUDA only): a change meant to keep the bits is checked in the same
command.

    python benchmarks/ab.py --a build-base/libflash_kda_train.so --b build-cuda/libflash_kda_train.so \\
        --shapes B1_T8192_H96,B2_T16384_H16 --out /tmp/ab [--rounds 2] [--bits] [-- bench arguments]

Arguments after `--` go to every benchmark run (e.g. `--warmup 2 --reps 10`, `--device cpu`). The
runs' JSON files stay in --out (a_1.json, b_1.json, ...), the table goes to stdout and to
--out/ab.md. Exits 1 when a run fails or, with --bits, when a tensor differs.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
from typing import Dict, List, Optional, Sequence, Tuple

_ROOT = pathlib.Path(__file__).resolve().parents[1]
_NAME_WIDTH = 90  # characters of a kernel name in the table, as bench's report shows them


def _env(library: str) -> Dict[str, str]:
    return {**os.environ, "FLASH_KDA_TRAIN_LIBRARY": library}


def _run(command: Sequence[str], library: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(command), env=_env(library), capture_output=True, text=True, cwd=_ROOT)


def bits(libraries: Dict[str, str], out: pathlib.Path) -> Tuple[bool, str]:
    """Dumps with each library and compares: (equal, what bitdump's cmp printed)."""
    script = str(_ROOT / "scripts" / "bitdump.py")
    for side, library in libraries.items():
        done = _run([sys.executable, script, "dump", str(out / f"{side}.pt")], library)
        if done.returncode != 0:
            return False, f"bitdump dump with {side} ({library}) failed:\n{done.stdout}{done.stderr}"
    done = _run([sys.executable, script, "cmp", str(out / "a.pt"), str(out / "b.pt")], libraries["a"])
    return done.returncode == 0, (done.stdout + done.stderr).strip()


def bench_runs(libraries: Dict[str, str], shapes: str, rounds: int, extra: List[str],
               out: pathlib.Path) -> Dict[str, List[dict]]:
    """Every round's benchmark JSON per side ("a", "b"); raises RuntimeError when a run fails."""
    runs: Dict[str, List[dict]] = {side: [] for side in libraries}
    for r in range(1, rounds + 1):
        for side, library in libraries.items():
            path = out / f"{side}_{r}.json"
            command = [sys.executable, "-m", "flash_kda_train.bench", "--impls", "ours", "--accuracy", "off",
                       "--shapes", shapes, "--out", str(path)] + (["--profile"] if r == 1 else []) + extra
            done = _run(command, library)
            if done.returncode != 0:
                raise RuntimeError(f"benchmark round {r} with {side} ({library}) failed:\n{done.stdout}{done.stderr}")
            runs[side].append(json.loads(path.read_text()))
    return runs


def _rows(data: dict) -> Dict[Tuple[str, str], dict]:
    return {(r["shape"], r["config"]): r["ours"] for r in data["results"]}


def _joined(values: Sequence[Optional[float]], digits: int, sep: str) -> str:
    """The values with `digits` decimals, a dash for a missing one, joined by sep."""
    return sep.join("–" if v is None else f"{v:.{digits}f}" for v in values)


def _ms(values: Sequence[Optional[float]]) -> str:
    return _joined(values, 3, ", ")


def _peaks(ours: dict) -> str:
    """The first round's peak extra memory, forward / forward+backward (the same in every round)."""
    return _joined([ours.get("peak_extra_gb_fwd"), ours.get("peak_extra_gb_fwd_bwd")], 2, " / ")


def _kernels(ours: dict, phase: str) -> Dict[str, Tuple[int, float]]:
    profile = (ours.get("profiles") or {}).get(phase) or {}
    return {k["name"]: (k["calls"], k["ms"]) for k in profile.get("kernels", [])}


def report(runs: Dict[str, List[dict]], libraries: Dict[str, str], bits_output: Optional[str] = None) -> str:
    """The markdown tables: timed medians of every round, then each kernel's GPU time (profiled round)."""
    lines = [f"# A/B: A = `{libraries['a']}`, B = `{libraries['b']}`", ""]
    if bits_output is not None:
        lines += ["Bits (`scripts/bitdump.py cmp`):", ""] + [f"    {line}" for line in bits_output.splitlines()] + [""]
    a_rows = [_rows(d) for d in runs["a"]]
    b_rows = [_rows(d) for d in runs["b"]]
    lines += ["| shape | config | fwd ms A | fwd ms B | fwd+bwd ms A | fwd+bwd ms B | peak GB A | peak GB B |",
              "|---|---|---|---|---|---|---|---|"]
    for key in a_rows[0]:
        cells = [_ms([row.get(key, {}).get(field) for row in rows])
                 for field in ("fwd_ms", "fwd_bwd_ms") for rows in (a_rows, b_rows)]
        cells += [_peaks(rows[0].get(key, {})) for rows in (a_rows, b_rows)]
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")
    for key, a in a_rows[0].items():
        b = b_rows[0].get(key, {})
        for phase in ("forward", "forward+backward"):
            ka, kb = _kernels(a, phase), _kernels(b, phase)
            if not ka and not kb:
                continue
            total_a, total_b = sum(ms for _, ms in ka.values()), sum(ms for _, ms in kb.values())
            unit = ((a.get("profiles") or b.get("profiles") or {}).get(phase) or {}).get("unit", "time")
            lines += ["", f"### {key[0]} / {key[1]} / {phase}: {unit} {total_a:.3f} -> {total_b:.3f} ms",
                      "", "| kernel | calls A / B | ms A | ms B | B - A |", "|---|---|---:|---:|---:|"]
            names = list(ka) + [n for n in kb if n not in ka]
            for name in sorted(names, key=lambda n: -max(ka.get(n, (0, 0.0))[1], kb.get(n, (0, 0.0))[1])):
                calls_a, ms_a = ka.get(name, (0, 0.0))
                calls_b, ms_b = kb.get(name, (0, 0.0))
                shown = name if len(name) <= _NAME_WIDTH else name[:_NAME_WIDTH - 3] + "..."
                lines.append(f"| `{shown}` | {calls_a} / {calls_b} | {ms_a:.3f} | {ms_b:.3f} | {ms_b - ms_a:+.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: List[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", required=True, help="library A (libflash_kda_train.so)")
    parser.add_argument("--b", required=True, help="library B")
    parser.add_argument("--shapes", required=True, help="the benchmark's --shapes")
    parser.add_argument("--out", required=True, help="folder for the runs' JSON files and ab.md")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of A then B (the first profiled)")
    parser.add_argument("--bits", action="store_true", help="compare every output and gradient bit for bit first")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds: expected at least 1, got {args.rounds}")
    libraries = {"a": str(pathlib.Path(args.a).resolve()), "b": str(pathlib.Path(args.b).resolve())}
    for side, library in libraries.items():
        if not pathlib.Path(library).is_file():
            parser.error(f"--{side}: no library at {library}")
    out = pathlib.Path(args.out).resolve()  # the runs write from the repository root
    out.mkdir(parents=True, exist_ok=True)
    status, bits_output = 0, None
    if args.bits:
        equal, bits_output = bits(libraries, out)
        status = 0 if equal else 1
    try:
        runs = bench_runs(libraries, args.shapes, args.rounds, extra, out)
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    text = report(runs, libraries, bits_output)
    (out / "ab.md").write_text(text)
    print(text, end="")
    return status


if __name__ == "__main__":
    sys.exit(main())
