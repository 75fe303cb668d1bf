"""The main job runs a training step and checks it against the fp64 gold."""

import flash_kda_train.__main__ as main_job


def test_main_job_small(capsys):
    assert main_job.main(["--tokens", "130", "--dim", "32", "--heads", "2", "--value-heads", "4"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "ddt_bias" in out
