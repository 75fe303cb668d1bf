"""chunk_kda on the CPU backend (forward and every gradient through autograd) against the fp64
token-by-token gold on the same inputs, over the option grid."""

import pytest
import torch

import flash_kda_train as fkt
from kda_cases import LEAVES, make_inputs, rel_rms

GRID = [
    dict(),
    dict(gate_in_kernel=True),                                        # softplus gate
    dict(gate_in_kernel=True, lower_bound=-3.0),                      # bounded sigmoid, A_log
    dict(gate_in_kernel=True, lower_bound=-5.0, safe_gate=True, no_A_log=True),
    dict(beta_logits=True),
    dict(beta_logits=True, allow_neg_eigval=True),
    dict(l2norm=True),
    dict(HV=4),                                                       # GVA
    dict(K=8, V=24, state_v_first=True),
    dict(K=24, V=8, scale=0.3),
    dict(state=False, final=False),
    dict(chunk_size=32, T=130),
    dict(T=1), dict(T=63), dict(T=64), dict(T=65),
    dict(B=1, T=165, cu_seqlens=[0, 1, 17, 17, 100, 165]),
    dict(B=1, T=130, cu_seqlens=[0, 64, 65, 130], chunk_size=32, gate_in_kernel=True, l2norm=True, HV=4),
]


def run(case, dtype):
    case = dict(case)
    opts = dict(scale=case.pop("scale", None), chunk_size=case.pop("chunk_size", 64),
                use_qk_l2norm_in_kernel=case.pop("l2norm", False), lower_bound=case.pop("lower_bound", None),
                safe_gate=case.pop("safe_gate", False), allow_neg_eigval=case.pop("allow_neg_eigval", False),
                output_final_state=case.pop("final", True))
    no_A_log = case.pop("no_A_log", False)
    x = make_inputs(dtype=dtype, **case)
    if no_A_log:
        x["A_log"] = None
    opts.update(use_gate_in_kernel=case.get("gate_in_kernel", False),
                use_beta_sigmoid_in_kernel=case.get("beta_logits", False),
                state_v_first=case.get("state_v_first", False))
    kw = dict(initial_state=x["initial_state"], A_log=x["A_log"], dt_bias=x["dt_bias"], cu_seqlens=x.get("cu_seqlens"),
              **opts)
    o, ht = fkt.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], **kw)
    do = torch.randn(o.shape).to(o.dtype)
    dht = torch.randn(ht.shape).to(ht.dtype) if ht is not None else None
    torch.autograd.backward([o] + ([ht] if ht is not None else []), [do] + ([dht] if ht is not None else []))
    go, ght, grads = fkt.reference.gold(x["q"], x["k"], x["v"], x["g"], x["beta"], do=do, dht=dht, **kw)
    errors = {"o": rel_rms(o, go)}
    if ht is not None:
        errors["final_state"] = rel_rms(ht, ght)
    for name, leaf in LEAVES:
        ref = getattr(grads, name)
        if ref is None:
            assert x[leaf] is None or x[leaf].grad is None, f"{name} should be absent"
            continue
        errors[name] = rel_rms(x[leaf].grad, ref)
    return errors


@pytest.mark.parametrize("case", GRID, ids=[str(c) for c in GRID])
def test_fp32_matches_gold(case):
    errors = run(case, torch.float32)
    assert max(errors.values()) < 1e-5, errors


@pytest.mark.parametrize("case", GRID[:10:3] + GRID[-2:], ids=[str(c) for c in GRID[:10:3] + GRID[-2:]])
def test_fp64_matches_gold(case):
    errors = run(case, torch.float64)
    assert max(errors.values()) < 1e-12, errors


# Results are rounded once to the input dtype (bf16: 8 significant bits, fp16: 11); the fp32 state
# and dh0 carry only accumulation error.
@pytest.mark.parametrize("dtype,bound", [(torch.bfloat16, 4e-3), (torch.float16, 1e-3)])
@pytest.mark.parametrize("case", [dict(gate_in_kernel=True, lower_bound=-5.0, safe_gate=True, HV=4),
                                  dict(B=1, T=165, cu_seqlens=[0, 1, 17, 17, 100, 165], l2norm=True)])
def test_low_precision_matches_gold(case, dtype, bound):
    errors = run(case, dtype)
    assert max(errors.values()) < bound, errors
    assert errors["final_state"] < 2e-5 and errors["dh0"] < 2e-5, errors


def test_empty_sequence_passes_state_through():
    x = make_inputs(B=1, T=40, cu_seqlens=[0, 20, 20, 40], requires_grad=False)
    h0 = x["initial_state"]
    _, ht = fkt.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=h0, output_final_state=True,
                          cu_seqlens=x["cu_seqlens"])
    assert torch.equal(ht[1], h0[1])
    out, ht2, ctx = fkt.forward(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=h0, output_final_state=True,
                                cu_seqlens=x["cu_seqlens"])
    dht = torch.randn_like(ht2)
    grads = fkt.backward(ctx, torch.zeros_like(out), dht)
    assert torch.equal(grads.dh0[1], dht[1])
