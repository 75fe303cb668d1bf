"""The benchmark command's plumbing on the CPU: registry, JSON fields, markdown table, report."""

import json

import pytest

from flash_kda_train import bench


def test_registry_holds_the_portfolio():
    names = [s.name for s in bench.PORTFOLIO]
    assert names == ["B1_T8192_H96", "varlen1024x8_H96", "varlen6_H96", "B2_T16384_H16", "B4_T2048_H16",
                     "B4_T4096_H64", "B1_T8192_H64", "B8_T4096_H32", "B1_T32768_H32", "gva_B2_T8192_H16_HV64"]
    varlen6 = bench.REGISTRY["varlen6_H96"]
    assert varlen6.seqlens == (1300, 547, 2048, 963, 271, 3063) and varlen6.T == sum(varlen6.seqlens)
    gva = bench.REGISTRY["gva_B2_T8192_H16_HV64"]
    assert (gva.B, gva.T, gva.H, gva.HV) == (2, 8192, 16, 64)
    assert [s.name for s in bench.select_shapes("B1_*")] == ["B1_T8192_H96", "B1_T8192_H64", "B1_T32768_H32"]
    assert [s.name for s in bench.select_shapes("varlen*,B4_T2048_H16")] == [
        "varlen1024x8_H96", "varlen6_H96", "B4_T2048_H16"]
    assert bench.select_shapes("B1_T8192_H96")[0].scaled(0.125).T == 1024
    assert bench.REGISTRY["varlen6_H96"].scaled(0.5).seqlens == (650, 274, 1024, 482, 136, 1532)
    adhoc = bench.select_shapes("B3_T100_H2_HV4,varlen50x2_H2")
    assert (adhoc[0].B, adhoc[0].T, adhoc[0].H, adhoc[0].HV) == (3, 100, 2, 4)
    assert adhoc[1].seqlens == (50, 50)
    with pytest.raises(SystemExit):
        bench.select_shapes("no_such_shape")


def test_bench_cpu_tiny(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = bench.main(["--shapes", "B1_T64_H2,varlen40x2_H2_HV4", "--dim", "32", "--device", "cpu", "--reps", "2",
                     "--warmup", "1", "--out", str(out), "--git-commit", "abc123", "--profile"])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["git"]["commit"] == "abc123"
    for key in ("device", "torch", "triton", "fla", "flash_kda_train"):
        assert key in data["environment"]
    assert data["protocol"]["reps"] == 2 and data["protocol"]["warmup"] == 1
    assert data["configs"]["default"]["use_gate_in_kernel"] and data["configs"]["default"]["lower_bound"] == -5.0
    assert [r["shape"] for r in data["results"]] == ["B1_T64_H2", "varlen40x2_H2_HV4"]
    for r in data["results"]:
        assert r["config"] == "default"
        ours = r["ours"]
        assert ours["status"] == "ok", ours
        assert ours["fwd_ms"] > 0 and ours["fwd_bwd_ms"] > 0 and len(ours["fwd_bwd_times_ms"]) == 2
        # Tiny shapes get the accuracy columns: errors of o, the final state and every gradient.
        assert set(ours["errors"]) == set(bench.ERROR_TENSORS)
        assert max(ours["errors"].values()) < 1e-2
        assert set(ours["profiles"]) == {"forward", "forward+backward"}
        assert ours["profiles"]["forward+backward"]["kernels"][0]["ms"] > 0
        assert r["fla"]["status"] == "unavailable" and "CUDA" in r["fla"]["reason"]
        assert r["speedup"] == {"fwd": None, "fwd_bwd": None}
        assert ours["achieved_tbps"]["fwd_bwd"] == pytest.approx(
            r["min_traffic_gb"]["fwd_bwd"] * 1e9 / (ours["fwd_bwd_ms"] * 1e-3) / 1e12)
    # Minimum traffic of B1_T64_H2, K = V = 32, bf16 inputs, the default config, by hand: q, k, v, g
    # 64 x 2 x 32 bf16 = 8192 B each, beta 256 B, A_log 8 B, dt_bias 256 B, h0 and dht 8192 B (fp32),
    # o and do 8192 B; inputs 41480 B. fwd: inputs + o + ht; fwd+bwd: 2 x inputs + do, dht + o, ht +
    # one gradient per input.
    assert data["results"][0]["min_traffic_gb"] == pytest.approx(dict(fwd=57864e-9, fwd_bwd=157208e-9))
    assert data["environment"]["copy_tbps"] is None  # measured on CUDA only
    md = out.with_suffix(".md").read_text()
    assert "| shape | config | ours fwd ms |" in md and "| B1_T64_H2 | default |" in md
    assert "Relative RMS error" in md and "Per-kernel breakdown" in md
    assert "## Achieved bandwidth" in md and "| B1_T64_H2 | default | 5.79e-05 / 0.000157 |" in md

    # The report regenerates the markdown from the JSON alone.
    md2 = tmp_path / "again.md"
    assert bench.main(["--report", str(out), "--md", str(md2), "--no-png"]) == 0
    assert md2.read_text() == md


def test_refusal_is_recorded(tmp_path):
    """Where our op refuses a call (here: the CUDA backend asked for CPU tensors), the row says why and goes on."""
    out = tmp_path / "r.json"
    assert bench.main(["--shapes", "B1_T16_H1", "--dim", "16", "--device", "cpu", "--reps", "1", "--warmup", "0",
                       "--backend", "cuda", "--accuracy", "off", "--out", str(out), "--no-png"]) == 0
    row = json.loads(out.read_text())["results"][0]
    assert row["ours"]["status"] == "unsupported" and row["ours"]["reason"].startswith("ValueError")
    assert row["ours"]["fwd_ms"] is None
    assert "unsupp." in out.with_suffix(".md").read_text()


def test_png_from_json(tmp_path):
    pytest.importorskip("matplotlib")
    data = {"environment": {"device": "test"}, "git": {"commit": "abc"}, "results": [
        {"shape": "B1_T64_H2", "config": "default", "ours": {"fwd_ms": 1.0, "fwd_bwd_ms": 3.0},
         "fla": {"fwd_ms": 2.5, "fwd_bwd_ms": 6.0}, "speedup": {"fwd": 2.5, "fwd_bwd": 2.0}},
        {"shape": "B4_T2048_H16", "config": "default", "ours": {"status": "unsupported", "reason": "ValueError: x"},
         "fla": {"fwd_ms": 1.1, "fwd_bwd_ms": 4.2}, "speedup": {"fwd": None, "fwd_bwd": None}}]}
    png = tmp_path / "r.png"
    assert bench.render_png(data, png) is None
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = bench.render_markdown(data)
    assert "2.50x" in md and "unsupp." in md and "ValueError: x" in md


def test_ours_only_options_are_recorded(tmp_path):
    """--segment-size and --disable-recompute reach our call only, and the report says so."""
    out = tmp_path / "r.json"
    assert bench.main(["--shapes", "B1_T200_H2,varlen100x2_H2", "--dim", "16", "--device", "cpu", "--reps", "1",
                       "--warmup", "0", "--segment-size", "64", "--disable-recompute", "--out", str(out),
                       "--no-png"]) == 0
    data = json.loads(out.read_text())
    assert data["protocol"]["ours_options"] == {"segment_size": 64, "disable_recompute": True}
    for r in data["results"]:
        assert r["ours"]["status"] == "ok" and max(r["ours"]["errors"].values()) < 1e-2, r["ours"]
    assert "ours with segment_size=64, disable_recompute=True" in out.with_suffix(".md").read_text()
    with pytest.raises(SystemExit):
        bench.main(["--segment-size", "x"])
