"""benchmarks/ab.py on the CPU: two libraries (here the same one twice) benchmarked in alternating
processes, and the table of their timings and per-kernel times."""

import pytest

from flash_kda_train import _lib
from repo_scripts import load

ab = load("benchmarks/ab.py")
CPU_TINY = ["--", "--dim", "32", "--device", "cpu", "--reps", "2", "--warmup", "1"]


def test_ab_tables_every_round_and_kernel(tmp_path, capsys):
    library = _lib.lib._name
    rc = ab.main(["--a", library, "--b", library, "--shapes", "B1_T64_H2", "--out", str(tmp_path), "--rounds", "2"]
                 + CPU_TINY)
    assert rc == 0
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["a_1.json", "a_2.json", "b_1.json", "b_2.json"]
    text = (tmp_path / "ab.md").read_text()
    assert text == capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.startswith("| B1_T64_H2 | default |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # fwd A, fwd B, fwd+bwd A, fwd+bwd B: one median per round, each a positive time; then the peaks
    # of A and B, forward / forward+backward, which the CPU backend does not measure.
    assert len(cells) == 8, row
    for cell in cells[2:6]:
        times = [float(x) for x in cell.split(", ")]
        assert len(times) == 2 and min(times) > 0, cell
    assert cells[6:] == ["– / –", "– / –"], cells
    assert any(line.startswith("### B1_T64_H2 / default / forward+backward: ") for line in text.splitlines())
    kernel_rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert kernel_rows and all(line.count("|") == 6 for line in kernel_rows)


def test_ab_refuses_bad_arguments(tmp_path, capsys):
    library = _lib.lib._name
    with pytest.raises(SystemExit):
        ab.main(["--a", library, "--b", str(tmp_path / "none.so"), "--shapes", "B1_T64_H2", "--out", str(tmp_path)])
    assert "--b: no library at" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ab.main(["--a", library, "--b", library, "--shapes", "B1_T64_H2", "--out", str(tmp_path), "--rounds", "0"])
    assert "--rounds: expected at least 1, got 0" in capsys.readouterr().err


def test_ab_fails_when_a_run_fails(tmp_path, capsys):
    library = _lib.lib._name
    rc = ab.main(["--a", library, "--b", library, "--shapes", "no_such_shape", "--out", str(tmp_path), "--rounds", "1"]
                 + CPU_TINY)
    assert rc == 1
    assert "benchmark round 1 with a" in capsys.readouterr().err


def test_ab_peaks_forward_then_step():
    assert ab._peaks({"peak_extra_gb_fwd": 1.5351, "peak_extra_gb_fwd_bwd": 2.7305}) == "1.54 / 2.73"
    assert ab._peaks({"peak_extra_gb_fwd": 0.27, "peak_extra_gb_fwd_bwd": None}) == "0.27 / –"
