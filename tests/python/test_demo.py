"""The demo (python -m flash_kda_train demo): MQAR data, a short training run whose loss falls,
and the command line's subcommands."""

import io
import subprocess
import sys
import time

import torch

import flash_kda_train.__main__ as cli
from flash_kda_train import demo

TINY = ["--steps", "40", "--batch", "16", "--pairs", "4", "--queries", "4", "--keys", "16", "--values", "16",
        "--hidden", "32", "--layers", "1", "--heads", "1", "--head-dim", "16", "--eval-every", "20",
        "--eval-batch", "64", "--no-progress"]


def test_mqar_batch_is_associative_recall():
    cfg = demo.DemoConfig(pairs=5, queries=7, keys=20, values=9)
    tokens, targets = demo.mqar_batch(cfg, 64, torch.Generator().manual_seed(0))
    assert tokens.shape == targets.shape == (64, 2 * 5 + 7)
    keys, values = tokens[:, 0:10:2], tokens[:, 1:10:2]
    assert (keys < 20).all() and (values >= 20).all() and (values < 29).all()
    assert all(len(set(row.tolist())) == 5 for row in keys)  # distinct keys in a sequence
    assert (targets[:, :10] == -100).all()
    for b in range(64):
        pairs = dict(zip(keys[b].tolist(), values[b].tolist()))
        for pos in range(10, 17):
            assert targets[b, pos].item() == pairs[tokens[b, pos].item()]
    again, _ = demo.mqar_batch(cfg, 64, torch.Generator().manual_seed(0))
    assert torch.equal(tokens, again)  # seeded


def test_short_training_run_loss_falls():
    start = time.perf_counter()
    cfg = demo.DemoConfig(steps=40, batch=16, pairs=4, queries=4, keys=16, values=16, hidden=32, layers=1, heads=1,
                          head_dim=16, eval_every=20, eval_batch=64, progress=False)
    history = demo.train(cfg, log=lambda *_: None)
    assert history.device == "cpu" or torch.cuda.is_available()
    assert len(history.loss) == 40 and all(map(lambda x: x == x, history.loss))  # no NaN
    first, last = sum(history.loss[:5]) / 5, sum(history.loss[-5:]) / 5
    assert last < first - 0.3, f"loss did not fall: {first:.3f} -> {last:.3f}"
    assert history.eval_steps == [0, 20, 40] and len(history.accuracy) == 3
    assert time.perf_counter() - start < 30


def test_demo_subcommand(capsys):
    cli.main(["demo", *TINY])  # exit status: learned or not, both fine in 40 steps
    out = capsys.readouterr().out
    assert "MQAR" in out and "chance accuracy 25.0%" in out and "trained 40 steps" in out
    assert "recall accuracy" in out


def test_progress_bar_lines_without_terminal():
    stream = io.StringIO()
    bar = demo.Progress(20, stream=stream)
    for step in range(1, 21):
        bar.update(step, f"loss {1.0 / step:.3f}")
    lines = stream.getvalue().splitlines()
    assert 2 <= len(lines) <= 11 and lines[-1].startswith("[" + "#" * 30 + "] 20/20")


def test_cli_help_lists_subcommands():
    run = subprocess.run([sys.executable, "-m", "flash_kda_train", "--help"], capture_output=True, text=True,
                         env=_env())
    assert run.returncode == 0 and "demo" in run.stdout and "bench" in run.stdout
    run = subprocess.run([sys.executable, "-m", "flash_kda_train", "demo", "--help"], capture_output=True, text=True,
                         env=_env())
    assert run.returncode == 0 and "--steps" in run.stdout and "associative recall" in run.stdout


def _env():
    import os
    import pathlib

    import flash_kda_train

    env = dict(os.environ)
    package_parent = str(pathlib.Path(flash_kda_train.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
    return env


def test_bench_subcommand_calls_bench_main(monkeypatch):
    import types

    import flash_kda_train

    calls = []
    fake = types.ModuleType("flash_kda_train.bench")
    fake.main = lambda argv: calls.append(argv) or 7
    monkeypatch.setitem(sys.modules, "flash_kda_train.bench", fake)
    monkeypatch.setattr(flash_kda_train, "bench", fake, raising=False)
    assert cli.main(["bench", "--quick", "x"]) == 7
    assert calls == [["--quick", "x"]]


def test_bench_subcommand_without_bench_module(monkeypatch, capsys):
    import flash_kda_train

    monkeypatch.setitem(sys.modules, "flash_kda_train.bench", None)  # the import now fails
    monkeypatch.delattr(flash_kda_train, "bench", raising=False)
    assert cli.main(["bench"]) == 2
    assert "flash_kda_train.bench" in capsys.readouterr().err
