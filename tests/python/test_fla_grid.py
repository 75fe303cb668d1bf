"""FLA's own KDA training tests on our op: the 16 dense and 6 varlen cases of FLA's test_chunk and
test_chunk_varlen (kda-math.md 7.3 and 7.4: FLA's input recipes, options and thresholds), judged by
FLA's tolerance function (7.1, outside CI mode) against the fp64 gold on the same inputs.

Both backends run every case (CUDA: skipped without a GPU; it refuses the D = 256 case, K, V <= 128).
The CPU backend's whole grid takes about a minute on two cores: the grid itself runs in CI."""

import math

import pytest
import torch
import torch.nn.functional as F

import flash_kda_train as fkt
from kda_cases import LEAVES, needs_cuda

F16, BF16 = torch.float16, torch.bfloat16

# B, T, H, HV, D, scale, normalizer, mask_p, l2norm in op, gate in op, dtype, safe_gate, disable_recompute, C
DENSE = [
    (1, 63, 1, 1, 64, 1.0, 1.0, 0.0, False, False, F16, True, False, 64),
    (2, 500, 3, 3, 60, 1.0, 1.0, 0.0, False, False, F16, True, True, 64),
    (2, 1000, 3, 3, 64, 0.1, 1.0, 0.5, False, False, F16, False, True, 64),
    (3, 1024, 4, 4, 100, 1.0, 0.1, 0.0, False, False, F16, False, False, 64),
    (4, 1024, 4, 4, 128, 0.1, 1.0, 0.0, False, False, F16, True, True, 64),
    (4, 1024, 4, 4, 128, 0.1, 1.0, 0.0, True, False, F16, True, False, 64),
    (2, 1500, 4, 4, 128, 0.1, 10.0, 0.0, False, True, F16, False, True, 64),
    (4, 2048, 8, 8, 64, 0.1, 1.0, 0.0, False, True, F16, True, True, 64),
    (2, 1024, 2, 4, 64, 0.1, 1.0, 0.0, False, False, F16, False, False, 64),
    (2, 1024, 2, 8, 64, 0.1, 1.0, 0.0, False, True, F16, False, False, 64),
    (2, 1024, 4, 8, 128, 0.1, 1.0, 0.0, True, True, F16, False, False, 64),
    (2, 160, 2, 4, 64, 0.1, 1.0, 0.0, False, True, F16, True, True, 32),
    (2, 1024, 2, 4, 64, 0.1, 1.0, 0.0, True, True, BF16, True, False, 64),
    (2, 1024, 2, 4, 64, 0.1, 1.0, 0.0, False, True, BF16, False, False, 64),
    (2, 160, 2, 4, 64, 0.1, 1.0, 0.0, False, True, BF16, True, True, 32),
    (2, 1024, 2, 8, 128, 0.1, 1.0, 0.0, True, True, BF16, False, False, 64),
]
DENSE_THRESHOLDS = dict(o=0.005, final_state=0.005, dq=0.008, dk=0.008, dv=0.008, dg=0.02, dbeta=0.02, dh0=0.008,
                        ddt_bias=0.008)

# D, mask_p, cu_seqlens, gate in op, safe_gate, disable_recompute, C (H = 4, fp16)
VARLEN = [
    (60, 0.1, [0, 15], True, False, False, 64),
    (64, 0.9, [0, 256, 500, 1000], True, False, False, 64),
    (128, 0.5, [0, 256, 500, 1000], False, False, False, 64),
    (100, 0.0, [0, 15, 100, 300, 1200, 2000], True, False, False, 64),
    (256, 0.0, [0, 100, 300, 1200, 3000, 4096], False, True, True, 64),
    (60, 0.1, [0, 31, 96, 160], True, False, True, 32),
]
VARLEN_THRESHOLDS = dict(o=0.005, final_state=0.005, dq=0.007, dk=0.008, dv=0.007, dg=0.015, dbeta=0.015,
                         dh0=0.007, ddt_bias=0.005)
# dA_log is a warning in both of FLA's tests: measured, never failed on.
WARNING_ONLY = {"dA_log"}

def fla_ratio(ref: torch.Tensor, x: torch.Tensor):
    """FLA's tolerance quantities (kda-math.md 7.1): (max abs error, RMS(ref - x) / (RMS(ref) + 1e-8))."""
    ref, x = ref.detach().double().cpu(), x.detach().double().cpu()
    diff = ref - x
    return float(diff.abs().max()), float(diff.square().mean().sqrt() / (ref.square().mean().sqrt() + 1e-8))


def check_fla(name: str, ref: torch.Tensor, x: torch.Tensor, threshold: float):
    abs_err, ratio = fla_ratio(ref, x)
    if abs_err <= 1e-6:
        return
    assert not torch.isnan(x).any(), f"{name}: NaN"
    assert ratio < threshold, f"{name}: relative RMS {ratio:.3e} >= FLA's threshold {threshold} (max abs {abs_err:.3e})"


def dense_inputs(case):
    B, T, H, HV, D, scale, normalizer, mask_p, l2norm, gate_in_op, dtype, safe, disable_recompute, C = case
    q, k, v = (torch.rand(B, T, heads, D) for heads in (H, H, HV))
    if not l2norm:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    beta = torch.randn(B, T, HV).sigmoid()
    h0 = torch.randn(B, HV, D, D)
    A_log = dt_bias = None
    if gate_in_op:
        g = torch.randn(B, T, HV, D)
        A_log, dt_bias = torch.randn(HV), torch.randn(HV * D)
    else:
        g = F.logsigmoid(torch.randn(B, T, HV, D)) / normalizer
        g = g.masked_fill(torch.rand_like(g) < mask_p, 0.0)
        if safe:
            g = g.clamp(-5.0, 0.0)
    leaves = dict(q=q.to(dtype), k=k.to(dtype), v=v.to(dtype), g=g.to(dtype), beta=beta.to(dtype), initial_state=h0,
                  A_log=A_log, dt_bias=dt_bias)
    options = dict(scale=scale, use_qk_l2norm_in_kernel=l2norm, use_gate_in_kernel=gate_in_op, safe_gate=safe,
                   lower_bound=-5.0 if gate_in_op and safe else None, disable_recompute=disable_recompute,
                   chunk_size=C)
    d_final = torch.randn(B, HV, D, D)
    return leaves, options, d_final


def varlen_inputs(case):
    D, mask_p, offsets, gate_in_op, safe, disable_recompute, C = case
    H, T, N = 4, offsets[-1], len(offsets) - 1
    q = torch.randn(1, T, H, D)
    k = F.normalize(torch.randn(1, T, H, D), dim=-1)
    v = torch.randn(1, T, H, D)
    beta = torch.rand(1, T, H).sigmoid()
    h0 = torch.randn(N, H, D, D)
    A_log = dt_bias = None
    if gate_in_op:
        g = torch.randn(1, T, H, D)
        A_log, dt_bias = torch.empty(H).uniform_(1, 16).log(), torch.randn(H * D)
    else:
        g = F.logsigmoid(torch.randn(1, T, H, D))
        g = g.masked_fill(torch.rand_like(g) < mask_p, 0.0)
    g = g.masked_fill(torch.rand_like(g) < mask_p, -1000.0)
    if safe:
        g = g.clamp(-5.0, 0.0)
    leaves = dict(q=q.half(), k=k.half(), v=v.half(), g=g.half(), beta=beta.half(), initial_state=h0, A_log=A_log,
                  dt_bias=dt_bias)
    options = dict(use_gate_in_kernel=gate_in_op, safe_gate=safe, disable_recompute=disable_recompute, chunk_size=C,
                   cu_seqlens=torch.tensor(offsets, dtype=torch.int64))
    d_final = torch.rand(N, H, D, D)
    return leaves, options, d_final


def run_case(leaves, options, d_final, device, thresholds):
    leaves = {n: (t.to(device).requires_grad_() if t is not None else None) for n, t in leaves.items()}
    options = dict(options)
    host_offsets = options.get("cu_seqlens")  # the offsets as built, on the host
    if host_offsets is not None:
        options["cu_seqlens"] = host_offsets.to(device)
    o, ht = fkt.chunk_kda(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
                          initial_state=leaves["initial_state"], output_final_state=True, A_log=leaves["A_log"],
                          dt_bias=leaves["dt_bias"], cu_seqlens_cpu=host_offsets, **options)
    do = torch.randn(o.shape).to(o.dtype).to(device)
    d_final = d_final.to(device)
    torch.autograd.backward([o, ht], [do, d_final])

    gold_options = {n: v for n, v in options.items() if n not in ("disable_recompute", "chunk_size")}
    go, ght, grads = fkt.reference.gold(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"], do=do,
                                        dht=d_final, initial_state=leaves["initial_state"], A_log=leaves["A_log"],
                                        dt_bias=leaves["dt_bias"], **gold_options)
    check_fla("o", go, o, thresholds["o"])
    check_fla("final_state", ght, ht, thresholds["final_state"])
    for name, leaf in LEAVES:
        ref = getattr(grads, name)
        if ref is None or name in WARNING_ONLY:
            continue
        check_fla(name, ref, leaves[leaf].grad, thresholds[name])


def params(kind: str, cases):
    for index, case in enumerate(cases):
        yield pytest.param(case, "cpu", id=f"{kind}{index}-cpu")
        yield pytest.param(case, "cuda", marks=needs_cuda, id=f"{kind}{index}-cuda")


@pytest.mark.parametrize("case,device", list(params("dense", DENSE)))
def test_fla_dense_grid(case, device):
    torch.manual_seed(42)
    run_case(*dense_inputs(case), device, DENSE_THRESHOLDS)


@pytest.mark.parametrize("case,device", list(params("varlen", VARLEN)))
def test_fla_varlen_grid(case, device):
    torch.manual_seed(42)
    D = case[0]
    if device == "cuda" and D > 128:
        with pytest.raises(ValueError, match=r"head dims K, V <= 128"):
            run_case(*varlen_inputs(case), device, VARLEN_THRESHOLDS)
        return
    run_case(*varlen_inputs(case), device, VARLEN_THRESHOLDS)


def test_fla_tolerance_function():
    """The ratio is FLA's: RMS of the difference over RMS of the reference (+ 1e-8)."""
    ref = torch.tensor([3.0, 4.0])
    abs_err, ratio = fla_ratio(ref, torch.tensor([3.0, 5.0]))
    assert abs_err == 1.0 and math.isclose(ratio, math.sqrt(0.5) / (math.sqrt(12.5) + 1e-8))
    with pytest.raises(AssertionError, match="FLA's threshold"):
        check_fla("x", ref, torch.tensor([3.0, 5.0]), 0.01)
    check_fla("x", ref, ref + 1e-7, 1e-12)  # max abs error <= 1e-6 passes whatever the ratio
