"""Runs flash_kda_train.paddle.chunk_kda on the cases test_paddle.py wrote, in a process where
torch cannot be imported (which proves the Paddle path needs no torch).

    python paddle_worker.py CASES.json INPUTS.npz RESULTS.npz

Each case names its tensors (stored in INPUTS.npz as float32/int64 arrays of exactly
representable values), their dtype and whether they require a gradient, the keyword arguments of
the call, and the upstream gradients. RESULTS.npz gets, per case, the outputs and the gradients
as float32 (or int64) arrays, keyed "CASE/NAME"; "meta/..." keys hold what the worker checks of
the adapter itself.
"""

import json
import sys

sys.modules["torch"] = None  # any `import torch` now raises ModuleNotFoundError

import numpy as np  # noqa: E402
import paddle  # noqa: E402

import flash_kda_train  # noqa: E402
from flash_kda_train import _abi  # noqa: E402
from flash_kda_train.paddle import PADDLE, backward, chunk_kda, forward  # noqa: E402

ORDER = ("q", "k", "v", "g", "beta")


def tensor(array, dtype, requires_grad, noncontiguous=False):
    if noncontiguous:  # the same values, seen through a transposed (strided) view
        t = paddle.to_tensor(np.ascontiguousarray(array.swapaxes(1, 2))).transpose([0, 2, 1, 3])
        assert not t.is_contiguous()
    else:
        t = paddle.to_tensor(array)
    if dtype != str(array.dtype):
        t = t.astype(dtype)
    t.stop_gradient = not requires_grad
    return t


def as_numpy(t):
    if t is None:
        return None
    if t.dtype in (paddle.bfloat16, paddle.float16):
        t = t.astype("float32")
    return t.numpy()


def run_case(case, arrays, results):
    name = case["name"]
    tensors = {n: tensor(arrays[f"{name}/{n}"], spec["dtype"], spec["grad"], n in case.get("noncontiguous", ()))
               for n, spec in case["tensors"].items()}
    kwargs = dict(case["kwargs"])
    positional = [tensors[n] for n in ORDER]
    keywords = {n: t for n, t in tensors.items() if n not in ORDER and n not in ("do", "dht")}
    mode = case.get("mode", "autograd")
    if mode == "error":
        try:
            chunk_kda(*positional, **keywords, **kwargs)
        except (ValueError, TypeError, NotImplementedError) as e:
            results[f"{name}/error"] = np.array(f"{type(e).__name__}: {e}")
        else:
            results[f"{name}/error"] = np.array("no error")
        return
    if mode == "pair-modified":
        _, _, context = forward(*positional, **keywords, **kwargs)
        tensors["q"].add_(paddle.ones_like(tensors["q"]))
        try:
            backward(context, tensors["do"])
        except RuntimeError as e:
            results[f"{name}/error"] = np.array(f"{type(e).__name__}: {e}")
        else:
            results[f"{name}/error"] = np.array("no error")
        return
    if mode == "intermediate":
        with paddle.no_grad():
            o, final_state, h = chunk_kda(*positional, **keywords, **kwargs)
        outputs = dict(o=o, final_state=final_state, h=h)
    elif mode == "inference":  # no gradient to take: the plain forward, nothing saved
        with paddle.no_grad():
            o, final_state = chunk_kda(*positional, **keywords, **kwargs)
        outputs = dict(o=o, final_state=final_state)
    elif mode == "pair":
        o, final_state, context = forward(*positional, **keywords, **kwargs)
        grads = backward(context, tensors["do"], tensors.get("dht"))
        outputs = dict(o=o, final_state=final_state, **{f"grad_{n}": g for n, g in zip(
            ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state"), grads)})
    else:
        o, final_state = chunk_kda(*positional, **keywords, **kwargs)
        outputs = dict(o=o, final_state=final_state)
        loss = (o.astype("float32") * tensors["do"].astype("float32")).sum()
        if final_state is not None:
            loss = loss + (final_state * tensors["dht"]).sum()
        loss.backward()
        for n, t in tensors.items():
            if case["tensors"][n]["grad"]:
                outputs[f"grad_{n}"] = t.grad
    for key, value in outputs.items():
        if value is not None:
            results[f"{name}/{key}"] = as_numpy(value)


def describing_errors():
    """The messages of describing tensors the adapter refuses (None where one is not refused)."""
    strided = paddle.ones([2, 3, 4]).transpose([0, 2, 1])
    messages = {}
    for key, tensors in (("noncontiguous", (paddle.ones([2]), strided)), ("not_a_tensor", ([1.0], None))):
        try:
            _abi.describe_all(PADDLE, ("q", "k"), tensors)
            messages[key] = None
        except ValueError as e:
            messages[key] = str(e)
    return messages


def main():
    cases_path, inputs_path, results_path = sys.argv[1:]
    with open(cases_path) as f:
        cases = json.load(f)
    arrays = dict(np.load(inputs_path))
    results = {"meta/torch_absent": np.array("chunk_kda" not in flash_kda_train.__all__ and
                                             sys.modules.get("torch") is None)}
    for key, message in describing_errors().items():
        results[f"meta/error_{key}"] = np.array(str(message))
    for case in cases:
        run_case(case, arrays, results)
    np.savez(results_path, **results)
    print(f"paddle {paddle.__version__}: {len(cases)} cases run")


if __name__ == "__main__":
    main()
