"""The CUDA forward in pieces (docs/design.md, "The forward in pieces"): F4 of one piece beside F2 of
the next on a side stream gives the whole call's bits (o, the final state, what it saves for the
backward, so the gradients too), in a CUDA graph as well, with the launches the plan says; time
slices, side by side from the states of an exact scan, give the whole call's results within fp32
rounding."""

import pytest
import torch

import flash_kda_train as fkt
from kda_cases import capture_graph, launches, make_inputs, needs_cuda, rel_rms

pytestmark = needs_cuda

OPTIONS = dict(use_gate_in_kernel=True, safe_gate=True, lower_bound=-5.0, output_final_state=True)

# (case, forward_pieces, the pieces expected): bfloat16, K = V = 128 (pieces run at the common shape).
CASES = [
    (dict(B=2, T=1000), 2, 2),                                  # 16 chunks a row: two of 8
    (dict(B=1, T=2085, HV=4), 3, 3),                            # GVA; the time segments' starts at the cuts
    (dict(B=2, T=1300, state_v_first=True), 5, 5),              # 5, 5, 5, 5, 1 chunks; segment starts inside
    (dict(B=3, T=130), 16, 3),                                  # more pieces asked than chunks: one each
    (dict(B=2, T=777, state=False, l2norm=True), 4, 4),         # 4, 4, 4, 1 chunks; no initial state
    (dict(B=2, T=2048, H=12), -1, 2),                           # the planner's: F4 on 48 blocks, 32 chunks
    (dict(B=4, T=2048, H=16), -1, 1),                           # the planner's: F4 on 128 blocks, whole
    (dict(B=1, T=2048), -1, 2),                                 # the planner's: F4 on 4 blocks, 32 chunks, too
                                                                # few for three slices
]


def inputs(case, requires_grad=True, seed=0):
    case = dict(case)
    l2norm = case.pop("l2norm", False)
    torch.manual_seed(seed)
    x = make_inputs(K=128, V=128, dtype=torch.bfloat16, gate_in_kernel=True, requires_grad=False,
                    **{"H": 2, **case})
    x = {n: (t.cuda().requires_grad_(requires_grad and t.is_floating_point()) if t is not None else None)
         for n, t in x.items()}
    return x, dict(OPTIONS, use_qk_l2norm_in_kernel=l2norm, state_v_first=case.get("state_v_first", False))


def forward(x, opts, pieces):
    return fkt.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"], A_log=x["A_log"],
                         dt_bias=x["dt_bias"], forward_pieces=pieces, **opts)


# The inputs that take gradients, in the order of step's results after o and the final state, with
# the names of their gradients in the gold's.
GRADS = dict(q="dq", k="dk", v="dv", g="dg", beta="dbeta", initial_state="dh0", A_log="dA_log", dt_bias="ddt_bias")


def cotangents(o, ht):
    """The gradients of o and of the final state that step takes, the same for every call."""
    gen = torch.Generator(device=o.device).manual_seed(1)
    do = torch.randn(o.shape, generator=gen, device=o.device).to(o.dtype)
    return do, torch.randn(ht.shape, generator=gen, device=ht.device)


def step(x, opts, pieces):
    """o, the final state and every gradient (GRADS' order, present inputs) of one training step."""
    o, ht = forward(x, opts, pieces)
    wrt = [x[name] for name in GRADS if x[name] is not None]
    return [o.detach(), ht.detach(), *torch.autograd.grad((o, ht), wrt, cotangents(o, ht))]


def planned_call(x, opts, pieces):
    """The forward's inputs described and planned as chunk_kda does (flash_kda_train._abi)."""
    from flash_kda_train import _abi, _core

    cfg, A_log, dt_bias = _abi.resolve(128, None, opts["use_qk_l2norm_in_kernel"], True, False, False, True, -5.0,
                                       False, opts["state_v_first"],
                                       dict(forward_pieces=pieces, A_log=x["A_log"], dt_bias=x["dt_bias"]))
    inputs = _core.Inputs(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log, dt_bias, x["initial_state"], None, None)
    return _abi.Call(_core.TORCH, cfg, inputs)


def workspace_bytes(x, opts, pieces):
    """The forward's workspace as the library plans it."""
    return planned_call(x, opts, pieces).sizes().forward_workspace_bytes


@pytest.mark.parametrize("case,pieces,expected", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_pieces_give_the_whole_call_s_bits(case, pieces, expected, poisoned):
    x, opts = inputs(case)
    whole, split = step(x, opts, 1), step(x, opts, pieces)
    for a, b in zip(whole, split):
        assert not b.isnan().any() and torch.equal(a, b)
    with torch.no_grad():
        counts = [launches(lambda: forward(x, opts, pieces), kernel)
                  for kernel in ("fwd_intra_kernel", "fwd_state_wgmma_kernel")]
    assert counts == [expected, expected]


def test_pieces_without_the_final_state():
    x, opts = inputs(dict(B=2, T=1300), requires_grad=False)
    opts["output_final_state"] = False
    with torch.no_grad():
        (whole, none_whole), (split, none_split) = (forward(x, opts, pieces) for pieces in (1, 4))
    assert none_whole is None and none_split is None and torch.equal(whole, split)


def test_pieces_with_intermediate_states():
    x, opts = inputs(dict(B=2, T=1300), requires_grad=False)
    with torch.inference_mode():
        whole, split = (fkt.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                                      A_log=x["A_log"], dt_bias=x["dt_bias"], return_intermediate_states=True,
                                      forward_pieces=pieces, **opts) for pieces in (1, 4))
    for a, b in zip(whole, split):
        assert torch.equal(a, b)


def test_pieces_in_a_cuda_graph_replayed_with_new_inputs():
    static, opts = inputs(dict(B=2, T=1300), requires_grad=False)
    graph, (o_graph, ht_graph) = capture_graph(lambda: forward(static, opts, 4))
    fresh, _ = inputs(dict(B=2, T=1300), requires_grad=False, seed=5)
    for name, t in fresh.items():
        if t is not None:
            static[name].copy_(t)
    graph.replay()
    o_whole, ht_whole = forward(static, opts, 1)
    torch.cuda.synchronize()
    assert torch.equal(o_graph, o_whole) and torch.equal(ht_graph, ht_whole)


# (case, the slices expected): F4's grid at most a quarter of the SMs (an H200's 132), at least 48 chunks.
SLICES = [
    (dict(B=1, T=3072), 3),                                 # F4 on 4 blocks, 48 chunks
    (dict(B=1, T=8229, HV=4), 8),                           # 129 chunks: 7 x 17 and 10; GVA; segment starts inside
    (dict(B=2, T=3100, state_v_first=True), 3),             # 49 chunks: 17, 17 and 15
    (dict(B=1, T=4096, H=1, state=False, l2norm=True), 4),  # no initial state
]


@pytest.mark.parametrize("case,expected", SLICES, ids=[f"slices{i}" for i in range(len(SLICES))])
def test_time_slices_match_the_whole_call(case, expected, poisoned):
    """o, the final state and every gradient (the backward reads the segment states the slices
    wrote) as close to the fp64 gold as the whole call's, and within a fraction of that error of
    them: the states entering the slices come from the summaries' fold, summed in another order
    than the chunk-by-chunk pass (the bound of the backward's time segments in
    test_cuda_backward.py, with room for o's bf16 roundings that the other order flips)."""
    x, opts = inputs(case)
    whole, sliced = step(x, opts, 1), step(x, opts, -1)
    assert all(not b.isnan().any() for b in sliced)
    do, dht = cotangents(whole[0], whole[1])
    cpu = {n: (t.detach().cpu() if t is not None else None) for n, t in x.items()}
    gold_o, gold_ht, gold = fkt.reference.gold(
        cpu["q"], cpu["k"], cpu["v"], cpu["g"], cpu["beta"], do=do.cpu(), dht=dht.cpu(),
        initial_state=cpu["initial_state"], A_log=cpu["A_log"], dt_bias=cpu["dt_bias"],
        **{k: v for k, v in opts.items() if k != "use_gate_in_kernel"}, use_gate_in_kernel=True)
    names = ["o", "final_state"] + [GRADS[n] for n in GRADS if x[n] is not None]
    refs = [gold_o, gold_ht] + [getattr(gold, GRADS[n]) for n in GRADS if x[n] is not None]
    for name, a, b, ref in zip(names, whole, sliced, refs):
        err_whole, err_sliced = rel_rms(a.cpu(), ref), rel_rms(b.cpu(), ref)
        assert err_sliced <= 1.1 * err_whole + 1e-6, (name, err_sliced, err_whole)
        assert rel_rms(b, a) <= 0.5 * err_whole + 1e-6, (name, rel_rms(b, a), err_whole)
    with torch.no_grad():
        counts = [launches(lambda: forward(x, opts, -1), kernel)
                  for kernel in ("fwd_intra_kernel", "fwd_state_wgmma_kernel", "cp_fold_kernel")]
    assert counts == [1, 2, 1]
    # The plan's slices, by the workspace they add: each but the last slice's summary [N, HV, K, V + K]
    # and entering state [N, HV, K, V], fp32.
    N, HV = x["q"].shape[0], x["v"].shape[2]
    added = workspace_bytes(x, opts, -1) - workspace_bytes(x, opts, 1)
    assert added == (expected - 1) * N * HV * 128 * (128 + 2 * 128) * 4


def test_time_slices_refuse_a_final_state_over_the_initial_state():
    """The C ABI's caller owns the outputs: one that passes the initial state's buffer as the final
    state gets an error from the forward in time slices, whose last slice writes the final state
    while its first reads the initial state."""
    import ctypes

    from flash_kda_train import _abi, _core, _lib

    x, opts = inputs(dict(B=1, T=3072), requires_grad=False)
    call = planned_call(x, opts, -1)
    workspace = call.buffer(call.sizes().forward_workspace_bytes)
    outs = _abi.describe_all(_core.TORCH, _lib.FORWARD_OUTPUT_NAMES,
                             (torch.empty_like(x["v"]), x["initial_state"], None, workspace, None))
    status = _lib.lib.fkt_forward(call.described.address, ctypes.byref(call.options), outs.address, call.stream())
    with pytest.raises(ValueError, match=r"final_state: overlaps initial_state, which the forward in time slices"):
        _lib.check(status)
