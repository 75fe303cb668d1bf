"""scripts/bitdump.py: two dumps compared bit for bit (the comparison runs anywhere; dumps need CUDA)."""

import torch

import repo_scripts

bitdump = repo_scripts.load("scripts/bitdump.py")


def _dump():
    return {"case": {"o": torch.tensor([1.0, -0.0], dtype=torch.bfloat16), "dq": torch.arange(4.0)}}


def test_identical_dumps_compare_equal():
    lines, same = bitdump.compare(_dump(), _dump())
    assert same and lines == ["2/2 tensors bitwise equal"]


def test_a_sign_of_zero_is_a_difference():
    other = _dump()
    other["case"]["o"] = torch.tensor([1.0, 0.0], dtype=torch.bfloat16)  # equal as numbers, not as bits
    lines, same = bitdump.compare(_dump(), other)
    assert not same
    assert lines == ["DIFFER case o: max abs difference 0.000e+00", "1/2 tensors bitwise equal"]


def test_a_changed_value_and_a_missing_tensor_are_named():
    other = _dump()
    other["case"]["dq"] = other["case"]["dq"] + torch.tensor([0.0, 0.0, 0.5, 0.0])
    other["extra"] = {"dk": torch.zeros(1)}
    lines, same = bitdump.compare(_dump(), other)
    assert not same
    assert lines == ["DIFFER case dq: max abs difference 5.000e-01", "MISSING extra dk", "1/3 tensors bitwise equal"]
