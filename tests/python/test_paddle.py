"""flash_kda_train.paddle.chunk_kda (a PyLayer over the same C ABI) against the PyTorch path on
the CPU backend: outputs and every gradient bitwise equal, for several configurations (in-kernel
gates, GVA, varlen, half precision, both state layouts, strided inputs, inputs without gradient),
plus the explicit forward/backward pair (and its guard against inputs modified in place between the
two calls), intermediate states and argument errors.

Paddle runs in a subprocess (paddle_worker.py) in which torch cannot be imported: the torch side
is computed here, the inputs go to the worker as exactly representable float32 arrays."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import flash_kda_train
from flash_kda_train import chunk_kda

pytestmark = pytest.mark.skipif(importlib.util.find_spec("paddle") is None,
                                reason="paddlepaddle is not installed (pinned in pyproject.toml's test extra)")

WORKER = pathlib.Path(__file__).with_name("paddle_worker.py")
ORDER = ("q", "k", "v", "g", "beta")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "int64": torch.int64}


def _case(name, B=2, T=100, H=2, HV=None, K=16, V=16, dtype="float32", gate="softplus", state=True,
          state_v_first=False, cu_seqlens=None, mode="autograd", seed=0, no_grad=(), noncontiguous=(), **kwargs):
    """Inputs (already rounded to their dtype) and the call's keyword arguments."""
    gen = torch.Generator().manual_seed(seed)
    HV = HV or H
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    dt = DTYPES[dtype]

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    tensors = dict(
        q=randn(B, T, H, K).to(dt),
        k=F.normalize(randn(B, T, H, K), dim=-1).to(dt),
        v=randn(B, T, HV, V).to(dt),
        g=(F.logsigmoid(randn(B, T, HV, K)) if gate == "pre" else randn(B, T, HV, K)).to(dt),
        beta=(randn(B, T, HV) if kwargs.get("use_beta_sigmoid_in_kernel") else torch.rand(B, T, HV, generator=gen))
        .to(dt),
    )
    if gate != "pre":
        kwargs["use_gate_in_kernel"] = True
        if gate != "sigmoid-no-A":
            tensors["A_log"] = randn(HV) * 0.5
        tensors["dt_bias"] = randn(HV * K)
    if state:
        tensors["initial_state"] = randn(N, HV, V, K) if state_v_first else randn(N, HV, K, V)
    if cu_seqlens is not None:
        tensors["cu_seqlens"] = torch.tensor(cu_seqlens, dtype=torch.int64)
    kwargs["state_v_first"] = state_v_first
    tensors["do"] = randn(B, T, HV, V).to(dt)
    if kwargs.get("output_final_state"):
        tensors["dht"] = randn(N, HV, V, K) if state_v_first else randn(N, HV, K, V)
    return dict(name=name, mode=mode, tensors=tensors, kwargs=kwargs, no_grad=list(no_grad),
                noncontiguous=list(noncontiguous))


def _wants_grad(case, name, t):
    return t.is_floating_point() and name not in ("do", "dht") and name not in case["no_grad"]


CASES = [
    _case("fp32-softplus-gate-l2norm", use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
          output_final_state=True),
    _case("bf16-varlen-gva-safe-gate", B=1, T=150, H=2, HV=4, K=32, V=16, dtype="bfloat16",
          cu_seqlens=[0, 37, 37, 150], safe_gate=True, lower_bound=-5.0, output_final_state=True, chunk_size=32),
    _case("fp16-pregate-vfirst-negeig", T=80, dtype="float16", gate="pre", state=False, state_v_first=True,
          use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True, output_final_state=True),
    _case("fp32-sigmoid-gate-no-A-log-no-final", T=64, K=8, V=24, gate="sigmoid-no-A", lower_bound=-3.0,
          scale=0.3),
    _case("fp32-partial-grads-strided", T=72, no_grad=("q", "k", "g", "A_log", "initial_state"),
          noncontiguous=("q", "v"), use_beta_sigmoid_in_kernel=True, output_final_state=True),
    _case("fp32-varlen-pair", B=1, T=90, cu_seqlens=[0, 20, 90], mode="pair", use_qk_l2norm_in_kernel=True,
          output_final_state=True),
    _case("bf16-intermediate-states", T=70, dtype="bfloat16", mode="intermediate", output_final_state=True,
          chunk_size=32, return_intermediate_states=True),
    _case("pair-input-modified", T=20, mode="pair-modified", no_grad=("q",)),
    _case("bf16-no-grad-forward", T=90, dtype="bfloat16", mode="inference", output_final_state=True),
    _case("error-chunk-size", T=20, mode="error", chunk_size=48),
    _case("error-state-dtype", T=20, mode="error", dtype="bfloat16", gate="pre"),
]
# initial_state in bfloat16: the library rejects it, naming the argument.
CASES[-1]["tensors"]["initial_state"] = CASES[-1]["tensors"]["initial_state"].to(torch.bfloat16)


def _torch_run(case):
    """The PyTorch path on the same inputs: outputs and gradients as float32/int64 arrays."""
    leaves = {n: t.clone().requires_grad_(_wants_grad(case, n, t)) for n, t in case["tensors"].items()}
    positional = [leaves[n] for n in ORDER]
    keywords = {n: t for n, t in leaves.items() if n not in ORDER and n not in ("do", "dht")}
    kwargs = dict(case["kwargs"], backend="cpu")
    mode = case["mode"]
    if mode == "error":
        with pytest.raises((ValueError, TypeError, NotImplementedError)) as error:
            chunk_kda(*positional, **keywords, **kwargs)
        return {"error": f"{error.type.__name__}: {error.value}"}
    if mode == "intermediate":
        with torch.inference_mode():
            o, final_state, h = chunk_kda(*positional, **keywords, **kwargs)
        return dict(o=o, final_state=final_state, h=h)
    if mode == "inference":
        with torch.no_grad():
            o, final_state = chunk_kda(*positional, **keywords, **kwargs)
        return dict(o=o, final_state=final_state)
    if mode == "pair-modified":  # q changed in place between the pair's calls
        _, _, context = flash_kda_train.forward(*positional, **keywords, **kwargs)
        leaves["q"].add_(1.0)
        with pytest.raises(RuntimeError) as error:
            flash_kda_train.backward(context, leaves["do"])
        return {"error": f"{error.type.__name__}: {error.value}"}
    if mode == "pair":
        o, final_state, context = flash_kda_train.forward(*positional, **keywords, **kwargs)
        grads = flash_kda_train.backward(context, leaves["do"], leaves.get("dht"))
        return dict(o=o, final_state=final_state, **{f"grad_{n}": g for n, g in zip(
            ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state"), grads) if g is not None})
    o, final_state = chunk_kda(*positional, **keywords, **kwargs)
    loss = (o.float() * leaves["do"].float()).sum()
    if final_state is not None:
        loss = loss + (final_state * leaves["dht"]).sum()
    loss.backward()
    out = dict(o=o, final_state=final_state)
    out.update({f"grad_{n}": t.grad for n, t in leaves.items() if t.requires_grad})
    return out


def _array(t):
    t = t.detach()
    return (t.float() if t.is_floating_point() else t).numpy()


@pytest.fixture(scope="module")
def paddle_results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("paddle")
    specs, arrays = [], {}
    for case in CASES:
        spec = dict(name=case["name"], mode=case["mode"], kwargs={**case["kwargs"], "backend": "cpu"}, tensors={},
                    noncontiguous=case["noncontiguous"])
        for n, t in case["tensors"].items():
            spec["tensors"][n] = dict(dtype=str(t.dtype).replace("torch.", ""), grad=_wants_grad(case, n, t))
            arrays[f"{case['name']}/{n}"] = _array(t)
        specs.append(spec)
    (folder / "cases.json").write_text(json.dumps(specs))
    np.savez(folder / "inputs.npz", **arrays)
    env = dict(os.environ)
    package_parent = str(pathlib.Path(flash_kda_train.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
    run = subprocess.run([sys.executable, str(WORKER), str(folder / "cases.json"), str(folder / "inputs.npz"),
                          str(folder / "results.npz")], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, f"paddle worker failed:\n{run.stdout}\n{run.stderr[-4000:]}"
    return dict(np.load(folder / "results.npz"))


def test_paddle_path_imports_no_torch(paddle_results):
    assert paddle_results["meta/torch_absent"].item() is True


def test_paddle_describing_names_the_argument_and_what_is_wrong(paddle_results):
    assert paddle_results["meta/error_noncontiguous"].item() == (
        "k: expected a contiguous paddle tensor (call .contiguous() first)")
    assert paddle_results["meta/error_not_a_tensor"].item() == "q: expected a paddle.Tensor, got list"


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_paddle_equals_torch(case, paddle_results):
    ours = {k.split("/", 1)[1]: v for k, v in paddle_results.items() if k.startswith(case["name"] + "/")}
    reference = _torch_run(case)
    if case["mode"] in ("error", "pair-modified"):
        assert ours["error"].item() == reference["error"]
        return
    expected = {k: _array(v) for k, v in reference.items() if v is not None}
    assert sorted(ours) == sorted(expected)
    for key, want in expected.items():
        got = ours[key]
        assert got.shape == want.shape, key
        if not np.array_equal(got, want):
            diff = np.abs(got.astype(np.float64) - want.astype(np.float64)).max()
            pytest.fail(f"{case['name']}: {key} differs from the PyTorch path (max abs difference {diff:.3e})")
