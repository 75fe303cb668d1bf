"""chunk_kda on the CPU backend over random combinations of its options and shapes (seeded draws):
the forward and every gradient against the fp64 gold on the same inputs, and single defects of an
otherwise valid call, each refused with a ValueError that names the argument. The option grid of
test_chunk_kda_vs_gold takes each option once; these draws take them together."""

import random

import pytest
import torch
import torch.nn.functional as F

import flash_kda_train as fkt
from kda_cases import LEAVES, rel_rms

# The bounds of test_chunk_kda_vs_gold: fp32 and fp64 compute the recurrence in their own precision;
# 16-bit results are rounded once to their dtype (bf16: 8 significant bits, fp16: 11), the fp32
# state and dh0 carry only accumulation error.
BOUNDS = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 4e-3, torch.float16: 1e-3}
STATE_BOUND_16BIT = 2e-5
# Some draws have a gradient that is exactly zero in exact arithmetic (dg where every sequence holds
# one token and there is no initial state: the terms of its chunk cancel), which the op returns as
# the rounding noise of those terms (1e-9 in a bf16 draw, terms of order 1): against a reference of
# zeros the error is the result's RMS over 1e-2, the scale of the terms it is the noise of.
ZERO_SCALE = 1e-2
# dA_log and ddt_bias are sums over every token of terms of both signs, taken from dg: a draw can
# make the sum arbitrarily small against its terms, and with it their relative error (over the
# first 2,000 draws up to 1.7e-4 with fp32 inputs and 2.6e-13 with fp64 ones, where the same calls'
# other tensors matched to 8e-6 and 2e-14). They are left to test_chunk_kda_vs_gold's grid, whose
# cases hold them to the bounds above; here dg, which they sum, is held, and they must be finite.
UNBOUNDED = ("dA_log", "ddt_bias")


def rel_err(x, ref):
    """kda_cases.rel_rms, or against a reference of zeros the RMS of x over ZERO_SCALE."""
    if bool(ref.any()):
        return rel_rms(x, ref)
    return float(x.detach().double().norm() / (ZERO_SCALE * ref.numel() ** 0.5))


def draw(seed):
    """(inputs, keyword arguments) of one valid call."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    dtype = rng.choice([torch.float32, torch.float32, torch.bfloat16, torch.float16, torch.float64])
    K, V = rng.choice([1, 2, 5, 8, 16, 17, 32, 64]), rng.choice([1, 2, 7, 16, 33, 64])
    H = rng.choice([1, 2, 3])
    HV = H * rng.choice([1, 1, 2])
    kw = dict(chunk_size=rng.choice([32, 64]), output_final_state=rng.random() < 0.7)
    cu = None
    if rng.random() < 0.4:  # packed sequences, some of them empty
        B, T = 1, rng.choice([1, 40, 65, 130])
        cu = sorted([0, T] + [rng.randint(0, T) for _ in range(rng.randint(0, 4))])
        kw["cu_seqlens"] = torch.tensor(cu, dtype=rng.choice([torch.int32, torch.int64]))
    else:
        B, T = rng.choice([1, 2, 3]), rng.choice([1, 31, 32, 33, 63, 64, 65, 100, 129])
    N = B if cu is None else len(cu) - 1
    gate_in_kernel = rng.random() < 0.5
    x = dict(q=randn(B, T, H, K), k=F.normalize(randn(B, T, H, K), dim=-1), v=randn(B, T, HV, V),
             g=randn(B, T, HV, K) if gate_in_kernel else F.logsigmoid(randn(B, T, HV, K)),
             beta=randn(B, T, HV) if rng.random() < 0.4 else torch.rand(B, T, HV, generator=gen))
    x = {name: t.to(dtype) for name, t in x.items()}
    state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    kw["state_v_first"] = rng.random() < 0.3
    if rng.random() < 0.7:
        shape = (N, HV, V, K) if kw["state_v_first"] else (N, HV, K, V)
        kw["initial_state"] = randn(*shape).to(state_dtype)
    if gate_in_kernel:
        kw["use_gate_in_kernel"] = True
        if rng.random() < 0.5:
            kw.update(safe_gate=True, lower_bound=rng.choice([-5.0, -1.0, -0.1]))
        if "lower_bound" not in kw or rng.random() < 0.5:
            kw["A_log"] = (0.5 * randn(HV)).to(state_dtype)
        if rng.random() < 0.6:
            kw["dt_bias"] = randn(HV * K).to(state_dtype)
    if x["beta"].min() < 0:  # logits
        kw["use_beta_sigmoid_in_kernel"] = True
        kw["allow_neg_eigval"] = rng.random() < 0.5
    # K = 1 leaves the l2norm's gradient at its eps term alone, a cancellation at fp32's rounding.
    kw["use_qk_l2norm_in_kernel"] = K > 1 and rng.random() < 0.3
    if rng.random() < 0.3:
        kw["scale"] = rng.choice([0.5, 1.0, 3.0])
    if rng.random() < 0.3:  # a strided view, as from a fused projection
        name = rng.choice(["q", "k", "v", "g"])
        wide = torch.cat([x[name], x[name]], dim=-1)
        x[name] = wide[..., : x[name].shape[-1]]
    return x, kw


@pytest.mark.parametrize("seed", range(400))
def test_random_call_matches_gold(seed):
    x, kw = draw(seed)
    leaves = dict(x, **{name: kw[name] for name in ("initial_state", "A_log", "dt_bias") if name in kw})
    for t in leaves.values():
        t.requires_grad_(True)
    o, ht = fkt.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], backend="cpu", **kw)
    gen = torch.Generator().manual_seed(seed)
    do = torch.randn(o.shape, generator=gen).to(o.dtype)
    dht = torch.randn(ht.shape, generator=gen).to(ht.dtype) if ht is not None else None
    torch.autograd.backward([o] + ([ht] if ht is not None else []), [do] + ([dht] if ht is not None else []))
    go, ght, grads = fkt.reference.gold(x["q"], x["k"], x["v"], x["g"], x["beta"], do=do, dht=dht, **kw)
    errors = {"o": rel_err(o, go)}
    if ht is not None:
        errors["final_state"] = rel_err(ht, ght)
    for name, leaf in LEAVES:
        if leaf not in leaves:
            continue
        ref = getattr(grads, name)
        assert ref is not None, f"{name} missing from the gold"
        if name in UNBOUNDED:
            assert torch.isfinite(leaves[leaf].grad).all(), (kw, name)
        else:
            errors[name] = rel_err(leaves[leaf].grad, ref)
    bound = BOUNDS[x["q"].dtype]
    assert max(errors.values()) < bound, (kw, errors)
    if x["q"].dtype in (torch.bfloat16, torch.float16):
        assert max(errors.get("final_state", 0.0), errors.get("dh0", 0.0)) < STATE_BOUND_16BIT, (kw, errors)


# One defect of a valid call and the argument its error must name first.
DEFECTS = [
    (lambda x, kw: x.update(k=x["k"][..., :-1] if x["k"].shape[-1] > 1 else torch.cat([x["k"]] * 2, -1)), "k"),
    (lambda x, kw: x.update(v=x["v"][:, :-1] if x["v"].shape[1] > 1 else torch.cat([x["v"]] * 2, 1)), "v"),
    (lambda x, kw: x.update(g=torch.cat([x["g"], x["g"]], -1)), "g"),
    (lambda x, kw: x.update(beta=x["beta"][..., None]), "beta"),
    (lambda x, kw: x.update(q=x["q"].to(torch.int32)), "q"),
    (lambda x, kw: kw.update(initial_state=torch.zeros(99, 1, 1, 1)), "initial_state"),
    (lambda x, kw: kw.update(initial_state=torch.zeros(1, 1, 1, 1, dtype=torch.bfloat16)), "initial_state"),
    (lambda x, kw: kw.update(chunk_size=48), "chunk_size"),
    (lambda x, kw: kw.update(use_gate_in_kernel=True, A_log=torch.zeros(x["v"].shape[2] + 1)), "A_log"),
    (lambda x, kw: kw.update(use_gate_in_kernel=True, A_log=torch.zeros(x["v"].shape[2]),
                             dt_bias=torch.zeros(x["v"].shape[2] * x["q"].shape[-1] + 1)), "dt_bias"),
    (lambda x, kw: kw.update(use_gate_in_kernel=True, safe_gate=True, lower_bound=-7.0), "lower_bound"),
]


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("defect", range(len(DEFECTS)))
def test_random_call_with_a_defect_is_refused(seed, defect):
    x, kw = draw(seed)
    make_defect, name = DEFECTS[defect]
    make_defect(x, kw)
    with pytest.raises(ValueError, match=rf"^\S+:\d+: {name}[:\s]|^{name}:"):
        fkt.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], backend="cpu", **kw)
