"""B3 and B4 in one kernel (backward/bwd_wy_intra.cuh), asked with FKT_FUSED_WY_INTRA=1: every
gradient bitwise the two kernels' (the same operations in the same order), with the fused kernel
launched in place of both."""

import pytest
import torch

import flash_kda_train as fkt
from kda_cases import make_inputs, needs_cuda

pytestmark = needs_cuda

# bfloat16, K = V = 128: the fused kernel's instance.
CASES = [
    dict(B=2, T=1000),                                  # q and k's gradients final in B4; time segments
    dict(B=1, T=700, HV=4),                             # GVA: B4's dq and dk partials reduced after it
    dict(B=2, T=333, l2norm=True),                      # the l2norm scales (the kernel's other instance)
    dict(B=1, T=900, cu_seqlens=[0, 1, 130, 600, 900]),  # varlen, tails inside chunks
]


def step(case):
    case = dict(case)
    l2norm = case.pop("l2norm", False)
    torch.manual_seed(0)
    x = make_inputs(K=128, V=128, dtype=torch.bfloat16, gate_in_kernel=True, requires_grad=False, **{"H": 2, **case})
    x = {n: (t.cuda().requires_grad_(t.is_floating_point()) if t is not None else None) for n, t in x.items()}
    o, ht = fkt.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                          A_log=x["A_log"], dt_bias=x["dt_bias"], cu_seqlens=x.get("cu_seqlens"),
                          use_gate_in_kernel=True, safe_gate=True, lower_bound=-5.0, output_final_state=True,
                          use_qk_l2norm_in_kernel=l2norm)
    wrt = [t for t in x.values() if t is not None and t.requires_grad]
    gen = torch.Generator(device="cuda").manual_seed(1)
    cotangents = (torch.randn(o.shape, generator=gen, device="cuda").to(o.dtype),
                  torch.randn(ht.shape, generator=gen, device="cuda"))
    return torch.autograd.grad((o, ht), wrt, cotangents)


def kernels(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {name: sum(e.count for e in prof.key_averages() if name in e.key)
            for name in ("bwd_wy_intra_kernel", "bwd_wy_inter_kernel", "bwd_intra_kernel")}


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_fused_wy_intra_gives_the_two_kernels_bits(case, monkeypatch, poisoned):
    monkeypatch.delenv("FKT_FUSED_WY_INTRA", raising=False)
    apart, launched_apart = step(case), kernels(lambda: step(case))
    monkeypatch.setenv("FKT_FUSED_WY_INTRA", "1")
    fused, launched_fused = step(case), kernels(lambda: step(case))
    for a, b in zip(apart, fused):
        assert not b.isnan().any() and torch.equal(a, b)
    assert launched_apart["bwd_wy_intra_kernel"] == 0 and launched_apart["bwd_wy_inter_kernel"] >= 1, launched_apart
    assert launched_apart["bwd_intra_kernel"] >= 1, launched_apart
    assert launched_fused["bwd_wy_intra_kernel"] >= 1 and launched_fused["bwd_wy_inter_kernel"] == 0, launched_fused
    assert launched_fused["bwd_intra_kernel"] == 0, launched_fused
