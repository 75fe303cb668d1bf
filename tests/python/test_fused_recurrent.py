"""fused_recurrent_kda (FLA's name and argument order for the token-by-token form) against the fp64
gold: outputs, final states and gradients in float64 (rel RMS <= 1e-10), decode-sized inputs
included, and its refusal of a per-value-column beta."""

import pytest
import torch

import flash_kda_train as fkt
from flash_kda_train import reference
from kda_cases import LEAVES, make_inputs, rel_rms

CASES = {
    "plain": dict(make=dict(), options=dict()),
    "one_token": dict(make=dict(B=3, T=1), options=dict()),
    "gate_softplus_l2norm": dict(make=dict(gate_in_kernel=True),
                                 options=dict(use_gate_in_kernel=True, use_qk_l2norm_in_kernel=True)),
    "gate_bounded_neg_eigval": dict(make=dict(gate_in_kernel=True, beta_logits=True),
                                    options=dict(use_gate_in_kernel=True, lower_bound=-5.0,
                                                 use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)),
    "varlen_gva_v_first": dict(make=dict(B=1, T=70, H=1, HV=2, cu_seqlens=[0, 1, 33, 70], state_v_first=True),
                               options=dict(state_v_first=True)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_gold(name):
    make, options = CASES[name]["make"], CASES[name]["options"]
    torch.manual_seed(sum(map(ord, name)))
    x = make_inputs(dtype=torch.float64, **make)
    cu = x.pop("cu_seqlens", None)
    A_log, dt_bias = x.pop("A_log"), x.pop("dt_bias")
    # FLA's positional order: q, k, v, g, beta, A_log, dt_bias, scale, initial_state, output_final_state.
    o, ht = fkt.fused_recurrent_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log, dt_bias, 0.3, x["initial_state"],
                                    True, cu_seqlens=cu, **options)
    d_o, d_ht = torch.randn_like(o), torch.randn_like(ht)
    torch.autograd.backward([o, ht], [d_o, d_ht])
    gold_o, gold_ht, grads = reference.gold(x["q"], x["k"], x["v"], x["g"], x["beta"], d_o, d_ht, scale=0.3,
                                            initial_state=x["initial_state"], cu_seqlens=cu, A_log=A_log,
                                            dt_bias=dt_bias, **options)
    assert rel_rms(o, gold_o) <= 1e-10 and rel_rms(ht, gold_ht) <= 1e-10
    leaves = {**x, "A_log": A_log, "dt_bias": dt_bias}
    for grad_name, leaf in LEAVES:
        if leaves[leaf] is None:
            continue
        assert rel_rms(leaves[leaf].grad, getattr(grads, grad_name)) <= 1e-10, grad_name


def test_defaults_follow_fla():
    x = make_inputs(dtype=torch.float64, state=False, requires_grad=False)
    o, ht = fkt.fused_recurrent_kda(x["q"], x["k"], x["v"], x["g"], x["beta"])
    assert ht is None and o.shape == x["v"].shape and o.dtype == x["q"].dtype
    gold_o, _, _ = reference.gold(x["q"], x["k"], x["v"], x["g"], x["beta"])
    assert rel_rms(o, gold_o) <= 1e-10


def test_per_value_column_beta_is_refused():
    x = make_inputs(requires_grad=False)
    beta = x["beta"][..., None].expand_as(x["v"])
    with pytest.raises(ValueError, match=r"beta: expected \[B, T, HV\] .* a beta per value column is not supported"):
        fkt.fused_recurrent_kda(x["q"], x["k"], x["v"], x["g"], beta)
