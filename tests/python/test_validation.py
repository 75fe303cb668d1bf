"""Every malformed input raises an error naming the argument, what was given and what is expected."""

import pytest
import torch

import flash_kda_train as fkt
from kda_cases import make_inputs


def call(x=None, **kw):
    x = x or make_inputs(requires_grad=False)
    return fkt.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], **kw)


def replace(**changes):
    x = make_inputs(requires_grad=False)
    x.update(changes)
    return x


CASES = [
    (lambda: call(replace(k=torch.randn(2, 100, 2, 8))), r"k: expected the shape of q \[2, 100, 2, 16\], got \[2, 100, 2, 8\]"),
    (lambda: call(replace(v=torch.randn(2, 99, 2, 16))), r"v: expected the batch and token extents of q"),
    (lambda: call(replace(v=torch.randn(2, 100, 3, 16), g=torch.randn(2, 100, 3, 16), beta=torch.rand(2, 100, 3))),
     r"multiple of the query/key head count H \(GVA\), got HV = 3, H = 2"),
    (lambda: call(replace(g=torch.randn(2, 100, 2, 8))), r"g: expected shape \[B, T, HV, K\] = \[2, 100, 2, 16\], got \[2, 100, 2, 8\]"),
    (lambda: call(replace(beta=torch.rand(2, 100, 2, 1))), r"beta: expected shape \[B, T, HV\] = \[2, 100, 2\]"),
    (lambda: call(replace(q=torch.randint(0, 3, (2, 100, 2, 16), dtype=torch.int32),
                          k=torch.randint(0, 3, (2, 100, 2, 16), dtype=torch.int32))),
     r"q: expected bfloat16, float16, float32 or float64, got int32"),
    (lambda: call(replace(k=torch.randn(2, 100, 2, 16, dtype=torch.float16))), r"k: expected the dtype of q \(float32\), got float16"),
    (lambda: call(replace(q=torch.randn(1, 4, 1, 257), k=torch.randn(1, 4, 1, 257), v=torch.randn(1, 4, 1, 4),
                          g=torch.randn(1, 4, 1, 257), beta=torch.rand(1, 4, 1))), r"K <= 256, got 257"),
    (lambda: call(initial_state=torch.randn(2, 2, 16, 16, dtype=torch.bfloat16)),
     r"initial_state: expected float32 .*, got bfloat16"),
    (lambda: call(initial_state=torch.randn(3, 2, 16, 16)), r"initial_state: expected one state per sequence, N = 2"),
    (lambda: call(make_inputs(requires_grad=False, K=16, V=8), initial_state=torch.randn(2, 2, 8, 16)),
     r"initial_state: expected shape \[N, HV, K, V\] \(state_v_first=False\) = \[2, 2, 16, 8\], got \[2, 2, 8, 16\]"),
    (lambda: call(make_inputs(requires_grad=False, B=1), cu_seqlens=torch.tensor([0.0, 100.0])),
     r"cu_seqlens: expected int32 or int64, got float32"),
    (lambda: call(make_inputs(requires_grad=False, B=1), cu_seqlens=torch.tensor([1, 100])), r"cu_seqlens\[0\] == 0, got 1"),
    (lambda: call(make_inputs(requires_grad=False, B=1), cu_seqlens=torch.tensor([0, 60, 50, 100])),
     r"non-decreasing offsets, got cu_seqlens\[2\] = 50 < cu_seqlens\[1\] = 60"),
    (lambda: call(make_inputs(requires_grad=False, B=1), cu_seqlens=torch.tensor([0, 60, 99], dtype=torch.int32)),
     r"last offset to equal the token count T = 100, got 99"),
    (lambda: call(cu_seqlens=torch.tensor([0, 100])), r"requires batch size B == 1, got B = 2"),
    (lambda: call(use_gate_in_kernel=True, safe_gate=True, lower_bound=-6.0, A_log=torch.zeros(2)),
     r"lower_bound: expected a value in \[-5, 0\) with safe_gate=True, got -6"),
    (lambda: call(use_gate_in_kernel=True, safe_gate=True, lower_bound=0.0, A_log=torch.zeros(2)),
     r"lower_bound: expected a value in \[-5, 0\) with safe_gate=True, got 0"),
    (lambda: call(use_gate_in_kernel=True, safe_gate=True, A_log=torch.zeros(2)), r"lower_bound: required when safe_gate=True"),
    (lambda: call(use_gate_in_kernel=True), r"A_log: required when use_gate_in_kernel=True and lower_bound is None"),
    (lambda: call(use_gate_in_kernel=True, A_log=torch.zeros(3)), r"A_log: expected a contiguous tensor of HV = 2 elements"),
    (lambda: call(use_gate_in_kernel=True, A_log=torch.zeros(2), dt_bias=torch.zeros(2, 15)),
     r"dt_bias: expected a contiguous tensor of HV \* K = 32 elements, got shape \[2, 15\]"),
    (lambda: call(chunk_size=16), r"chunk_size: must be either 32 or 64, got 16"),
    (lambda: call(use_gate_in_kernel=True, lower_bound=-1e300),
     r"lower_bound: expected a value within float32's range \(\|lower_bound\| <= 3.4e38\), which float32 inputs "
     r"are computed in; got -1e\+300"),
    (lambda: call(scale=1e39), r"scale: expected a value within float32's range .* got 1e\+39"),
    (lambda: call(allow_neg_eigval=True), r"allow_neg_eigval: requires use_beta_sigmoid_in_kernel=True"),
    (lambda: call(backend="tpu"), r"backend: expected one of"),
    (lambda: call(forward_pieces=17),
     r"forward_pieces: expected -1 \(the planner's choice\), 0 or 1 \(the whole call at once\) or a count up to 16, "
     r"got 17"),
    (lambda: call(forward_pieces=-2), r"forward_pieces: expected -1 .*, got -2"),
    (lambda: call(forward_pieces=True), r"forward_pieces: expected an integer \(-1, 0, 1 or a count of pieces\), got True"),
    (lambda: call(forward_pieces=2.0), r"forward_pieces: expected an integer .*, got 2.0"),
    (lambda: call(backend="cuda"), r"backend: the CUDA backend was requested but the tensors are on cpu"),
]


@pytest.mark.parametrize("index", range(len(CASES)))
def test_error_message(index):
    fn, pattern = CASES[index]
    with pytest.raises(ValueError, match=pattern):
        fn()


def test_errors_name_the_source_location():
    with pytest.raises(ValueError, match=r"^src/core/problem\.cpp:\d+: chunk_size"):
        call(chunk_size=48)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device to place one tensor elsewhere")
def test_mixed_devices():
    x = make_inputs(requires_grad=False)
    x["v"] = x["v"].cuda()
    with pytest.raises(ValueError, match="all tensors must be on the same device"):
        call(x)
