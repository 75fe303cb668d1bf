"""Context parallelism over torch.distributed: 1, 2 and 4 processes with Gloo on the CPU.

Every rank holds a contiguous T / world slice of a packed B = 1 batch (or, in FLA's zigzag layout,
parts r and 2 world - 1 - r of 2 world parts) and calls
``chunk_kda(..., cp_context=build_cp_context(cu_seqlens, group))`` (or with the context of FLA's
``get_cp_cu_seqlens``); its output and every gradient must equal the single-process result on the
same tokens (float64: rel RMS <= 1e-10, float32: <= 1e-5). The per-rank parameter gradients
(dA_log, ddt_bias) are the contributions of the rank's tokens: checked against a single-process run
in which each rank's tokens use their own copy of the parameters, and their sum over the group
against the full gradient.

The gates are weak (per-token log decay ~ -0.01) so that the state crossing a rank boundary
matters; each case also checks that it does (dropping the exchange would change o or the gradients by
more than 1e-3).

All cases of one world size run in one launch of `world` processes (spawned once, bounded by a
timeout); the parametrized tests then check the recorded errors. test_cuda_cp.py runs the same
cases on CUDA tensors over NCCL through `run_world`.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import importlib.util
import json
import os
import pathlib
import shutil
import tempfile
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import flash_kda_train as fkt
from flash_kda_train.cp import CPContext, build_cp_context

T = 192  # packed tokens: 96 per rank with 2 ranks, 48 with 4 (chunk 32: partial chunks at slice edges)

# name -> case. cu: global offsets; dtype; H, HV, K, V; flags.
CASES = {
    "one_sequence": dict(cu=[0, T]),
    # with 4 ranks the sequence [30, 101) covers ranks 0, 1 and 2; starts and ends inside slices
    "ragged": dict(cu=[0, 30, 101, 150, T]),
    "many_short": dict(cu=[0, 5, 17, 40, 41, 60, 90, 100, 130, 131, 170, T]),
    # [20, 130) over exactly 3 ranks with 4 ranks (and over both with 2)
    "three_ranks": dict(cu=[0, 20, 130, T]),
    # boundaries on every rank boundary (4 ranks: 48, 96, 144; an empty sequence at 96)
    "aligned": dict(cu=[0, 48, 96, 96, 144, T]),
    "gate_l2norm": dict(cu=[0, 30, 101, 150, T], gate="softplus", l2norm=True, beta_sigmoid=True),
    "safe_gate_neg_eigval": dict(cu=[0, 70, T], gate="sigmoid", l2norm=True, beta_sigmoid=True, neg_eigval=True),
    "gva": dict(cu=[0, 30, 101, 150, T], H=1, HV=4),
    "state_v_first": dict(cu=[0, 20, 130, T], state_v_first=True, K=8, V=12),
    "chunk64": dict(cu=[0, 100, T], chunk_size=64),
    "fp32": dict(cu=[0, 30, 101, 150, T], dtype=torch.float32),
    "fp32_gate_gva_vfirst": dict(cu=[0, 20, 130, T], dtype=torch.float32, gate="softplus", l2norm=True, H=1, HV=2,
                                 state_v_first=True),
    # FLA's zigzag layout: 2 world parts (48 tokens with 2 ranks, 24 with 4: shorter than a chunk),
    # rank r holding parts r and 2 world - 1 - r; with 2 ranks rank 1 holds parts 1 and 2, one sequence
    # crossing between its own two parts.
    "zigzag_one_sequence": dict(cu=[0, T], layout="zigzag"),
    "zigzag_ragged": dict(cu=[0, 30, 101, 150, T], layout="zigzag"),
    "zigzag_many_short": dict(cu=[0, 5, 17, 40, 41, 60, 90, 100, 130, 131, 170, T], layout="zigzag"),
    "zigzag_gate_l2norm": dict(cu=[0, 20, 130, T], gate="softplus", l2norm=True, beta_sigmoid=True, layout="zigzag"),
    "zigzag_gva_vfirst_chunk64": dict(cu=[0, 70, T], H=1, HV=4, state_v_first=True, K=8, V=12, chunk_size=64,
                                      layout="zigzag"),
    "zigzag_fp32": dict(cu=[0, 30, 101, 150, T], dtype=torch.float32, layout="zigzag"),
    # Boundaries on part boundaries (parts of 24 tokens with 4 ranks, 48 with 2, 96 with 1), an empty
    # sequence there, and one ending at the middle (T / 2), where rank world - 1's two parts meet.
    "zigzag_aligned": dict(cu=[0, 48, 96, 96, 144, T], layout="zigzag"),
    # One-token sequences at both ends, one sequence over every other token.
    "zigzag_spanning": dict(cu=[0, 1, T - 1, T], layout="zigzag"),
}
if importlib.util.find_spec("fla") is not None:  # fla-core, a test dependency (pyproject.toml)
    # The contexts of FLA's own get_cp_cu_seqlens (a drop-in's callers build them with FLA).
    CASES["fla_context"] = dict(cu=[0, 30, 101, 150, T], fla_context=True)
    CASES["fla_context_zigzag"] = dict(cu=CASES["many_short"]["cu"], layout="zigzag", fla_context=True)
    CASES["fla_context_zigzag_spanning"] = dict(cu=[0, 1, T - 1, T], layout="zigzag", fla_context=True)
WORLD_SIZES = (1, 2, 4)
BOUND = {torch.float64: 1e-10, torch.float32: 1e-5}
GRADS = ("q", "k", "v", "g", "beta")
PARAMS = ("A_log", "dt_bias")


def make_case(name, cases=CASES):
    """The global inputs and keyword arguments of a case (the same on every rank: seeded by name)."""
    spec = dict(H=2, HV=2, K=16, V=8, dtype=torch.float64, gate=None, l2norm=False, beta_sigmoid=False,
                neg_eigval=False, state_v_first=False, chunk_size=32, layout="contiguous", fla_context=False)
    spec.update(cases[name])
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    H, HV, K, V, dtype = spec["H"], spec["HV"], spec["K"], spec["V"], spec["dtype"]

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    k = randn(1, T, H, K)
    x = dict(q=randn(1, T, H, K), k=k if spec["l2norm"] else F.normalize(k, dim=-1), v=randn(1, T, HV, V),
             beta=randn(1, T, HV) if spec["beta_sigmoid"] else torch.sigmoid(randn(1, T, HV)))
    kw = dict(use_qk_l2norm_in_kernel=spec["l2norm"], use_beta_sigmoid_in_kernel=spec["beta_sigmoid"],
              allow_neg_eigval=spec["neg_eigval"], state_v_first=spec["state_v_first"], chunk_size=spec["chunk_size"])
    if spec["gate"] is None:
        x["g"] = 0.02 * F.logsigmoid(randn(1, T, HV, K))  # weak decay: the state crosses slices
    else:
        x["g"] = randn(1, T, HV, K) - 6.0  # raw gate; softplus / sigmoid of it ~ e^-6
        x["A_log"] = 0.5 * randn(HV)
        if spec["gate"] == "softplus":
            x["dt_bias"] = randn(HV * K)
        kw.update(use_gate_in_kernel=True)
        if spec["gate"] == "sigmoid":
            kw.update(lower_bound=-5.0, safe_gate=True)
    x = {n: t.to(dtype if n in GRADS else (torch.float64 if dtype == torch.float64 else torch.float32))
         for n, t in x.items()}
    d_o = randn(1, T, HV, V).to(dtype)
    cu = torch.tensor(spec["cu"], dtype=torch.int64)
    return x, kw, d_o, cu, spec


def leaves(x):
    return {n: t.detach().clone().requires_grad_(True) for n, t in x.items()}


def call(x, kw, **extra):
    params = {n: x[n] for n in PARAMS if n in x}
    return fkt.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], **params, **kw, **extra)[0]


def rel_rms(got, ref):
    got, ref = got.detach().double(), ref.detach().double()
    return float((got - ref).norm() / ref.norm().clamp_min(1e-300))


def torch_gate(g, A_log, dt_bias, kw):
    """The gate activation of kda-math.md section 2.2 in torch (G1 softplus / G2 bounded sigmoid)."""
    HV, K = g.shape[2], g.shape[3]
    x = g + dt_bias.view(HV, K) if dt_bias is not None else g
    rate = A_log.exp().view(HV, 1)
    if kw.get("lower_bound") is None:
        return -rate * F.softplus(x)
    return kw["lower_bound"] * torch.sigmoid(rate * x)


def owners(world, layout):
    """The rank holding each of the equal parts of the T tokens, in token order."""
    if layout == "contiguous":
        return list(range(world))
    return [s if s < world else 2 * world - 1 - s for s in range(2 * world)]


def token_ranges(rank, world, layout):
    """The [lo, hi) ranges of the global tokens that a rank holds, in its local order."""
    held = owners(world, layout)
    part = T // len(held)
    return [(s * part, (s + 1) * part) for s, r in enumerate(held) if r == rank]


def local_tokens(t, ranges):
    return torch.cat([t[:, lo:hi] for lo, hi in ranges], dim=1)


def per_rank_param_grads(x, kw, d_o, cu, world, layout):
    """dA_log, ddt_bias of each rank's tokens: the gate computed in torch with one parameter copy per rank."""
    copies = [{n: x[n].detach().clone().requires_grad_(True) for n in PARAMS if n in x} for _ in range(world)]
    held = owners(world, layout)
    part = T // len(held)
    g = torch.cat([torch_gate(x["g"][:, s * part:(s + 1) * part].detach(), copies[r]["A_log"],
                              copies[r].get("dt_bias"), kw) for s, r in enumerate(held)], dim=1)
    pre_kw = {n: v for n, v in kw.items() if n not in ("use_gate_in_kernel", "lower_bound", "safe_gate")}
    o = fkt.chunk_kda(*(x[n].detach() for n in ("q", "k", "v")), g, x["beta"].detach(), cu_seqlens=cu, **pre_kw)[0]
    torch.autograd.backward(o, d_o)
    return [{n: c[n].grad for n in c} for c in copies]


def run_case(name, rank, world, cases, device):
    """Errors of one case on this rank (a dict of floats), every tensor on `device`."""
    x, kw, d_o, cu, spec = make_case(name, cases)
    x, d_o, cu = {n: t.to(device) for n, t in x.items()}, d_o.to(device), cu.to(device)
    ranges = token_ranges(rank, world, spec["layout"])
    errors = {}

    # The single-process reference on the whole batch.
    ref = leaves(x)
    o_ref = call(ref, kw, cu_seqlens=cu)
    torch.autograd.backward(o_ref, d_o)

    # Context-parallel: this rank's slice.
    if spec["fla_context"]:
        from fla.ops.cp.context import get_cp_cu_seqlens

        ctx = get_cp_cu_seqlens(cu, world_size=world, rank=rank, layout=spec["layout"])
    else:
        ctx = build_cp_context(cu, group=None, layout=spec["layout"])
    mine = {n: (local_tokens(t, ranges) if n in GRADS else t).detach().clone().requires_grad_(True)
            for n, t in x.items()}
    o = call(mine, kw, cp_context=ctx)
    torch.autograd.backward(o, local_tokens(d_o, ranges))
    errors["o"] = rel_rms(o, local_tokens(o_ref, ranges))
    for n in GRADS:
        errors["d" + n] = rel_rms(mine[n].grad, local_tokens(ref[n].grad, ranges))
    params = [n for n in PARAMS if n in x]
    if params:
        expected = per_rank_param_grads(x, kw, d_o, cu, world, spec["layout"])[rank]
        for n in params:
            errors["d" + n] = rel_rms(mine[n].grad, expected[n])
            total = mine[n].grad.clone()
            dist.all_reduce(total)
            errors["d" + n + "_sum"] = rel_rms(total, ref[n].grad)

    # The exchange matters: without it (a plain local call) o or the gradients would differ.
    if spec["layout"] == "contiguous":
        errors["pre_num_ranks"], errors["post_num_ranks"] = ctx.pre_num_ranks, ctx.post_num_ranks
    else:
        errors["pre_num_ranks"] = max(ctx.pre_num_ranks_by_part)
        errors["post_num_ranks"] = max(ctx.post_num_ranks_by_part)
    plain = leaves({n: (local_tokens(t, ranges) if n in GRADS else t) for n, t in x.items()})
    o_plain = call(plain, kw, cu_seqlens=ctx.cu_seqlens)
    torch.autograd.backward(o_plain, local_tokens(d_o, ranges))
    errors["effect_forward"] = rel_rms(o_plain, local_tokens(o_ref, ranges))
    errors["effect_backward"] = max(rel_rms(plain[n].grad, local_tokens(ref[n].grad, ranges)) for n in ("q", "k", "v"))
    errors["bound"] = BOUND[spec["dtype"]]
    return errors


def _run_cases(rank, world, cases, device):
    return {name: run_case(name, rank, world, cases, device) for name in cases}


def _worker(rank, world, init_file, cases, out_dir, backend, body):
    torch.set_num_threads(1)
    device = torch.device("cpu")
    if backend == "nccl":  # one GPU per rank
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    results = body(rank, world, cases, device)
    pathlib.Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    # No rank may tear its Gloo transport down while a peer still uses it: a peer whose connection
    # drops mid-collective aborts ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


def _invalid_call(rank, world, cases, device):
    """Every rank makes the same invalid call (in-kernel gate without A_log); records what it raised and
    when. Rank 0 summarises (a sequence continues on rank 1), rank 1 does not."""
    n = T // world
    x = torch.randn(1, n, 1, 16, dtype=torch.float64)
    ctx = build_cp_context(torch.tensor([0, 100, T]))
    start = time.monotonic()
    try:
        fkt.chunk_kda(x, x, x, x, torch.rand(1, n, 1, dtype=torch.float64), use_gate_in_kernel=True, cp_context=ctx)
        raised = None
    except Exception as e:  # noqa: BLE001  (recorded for the parent to check)
        raised = f"{type(e).__name__}: {e}"
    return dict(raised=raised, seconds=time.monotonic() - start, post_num_ranks=ctx.post_num_ranks)


def run_world(world, backend, cases, timeout_s=240, body=_run_cases):
    """Runs `cases` on `world` spawned processes of a `backend` group; returns one dict of errors per rank."""
    out_dir = tempfile.mkdtemp(prefix=f"fkt_cp{world}_")
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # the library's OpenMP threads in each process
    try:
        context = mp.start_processes(_worker,
                                     args=(world, os.path.join(out_dir, "init"), cases, out_dir, backend, body),
                                     nprocs=world, join=False, start_method="spawn")
    finally:
        if saved is None:
            os.environ.pop("OMP_NUM_THREADS")
        else:
            os.environ["OMP_NUM_THREADS"] = saved
    try:
        deadline = time.monotonic() + timeout_s
        while not context.join(timeout=2):
            if time.monotonic() > deadline:
                for process in context.processes:
                    if process.is_alive():
                        process.kill()
                raise TimeoutError(f"context-parallel workers ({world} processes) did not finish in time")
        return [json.loads(pathlib.Path(out_dir, f"rank{r}.json").read_text()) for r in range(world)]
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


@functools.lru_cache(maxsize=None)
def launch(world):
    return run_world(world, "gloo", CASES)


def check_errors(rank, errors):
    """Every output and gradient within the case's bound, and the exchange not vacuous."""
    bound = errors["bound"]
    for key, value in errors.items():
        if key in ("o",) or key.startswith("d"):
            assert value <= bound, f"rank {rank}: {key} rel RMS {value:.3e} > {bound:g}"
    # Non-vacuous: the exchange changes the result wherever a sequence crosses into / out of the rank.
    if errors["pre_num_ranks"] > 0:
        assert errors["effect_forward"] > 1e-3, f"rank {rank}: the entering state barely matters"
    if errors["post_num_ranks"] > 0:
        assert errors["effect_backward"] > 1e-3, f"rank {rank}: the final-state gradient barely matters"


@pytest.mark.parametrize("world", WORLD_SIZES)
@pytest.mark.parametrize("name", list(CASES))
def test_outputs_and_gradients_match_single_process(world, name):
    for rank, results in enumerate(launch(world)):
        check_errors(rank, results[name])


def test_context_layout():
    cu = torch.tensor([0, 20, 130, 192])
    expected = [  # world 4, slices of 48: [0,48) [48,96) [96,144) [144,192)
        ([0, 20, 48], 0, 2),
        ([0, 48], 1, 1),
        ([0, 34, 48], 2, 1),
        ([0, 48], 1, 0),
    ]
    for rank, (local, pre, post) in enumerate(expected):
        ctx = build_cp_context(cu, rank=rank, world_size=4)
        assert ctx.cu_seqlens.tolist() == local and ctx.cu_seqlens_cpu.tolist() == local
        assert (ctx.pre_num_ranks, ctx.post_num_ranks) == (pre, post), rank
        assert ctx.is_first_rank == (pre == 0) and ctx.is_last_rank == (post == 0)
    # Boundaries on rank boundaries and an empty sequence there: nothing crosses.
    for rank in range(4):
        ctx = build_cp_context(torch.tensor([0, 48, 96, 96, 144, 192]), rank=rank, world_size=4)
        assert ctx.cu_seqlens.tolist() == [0, 48] and ctx.pre_num_ranks == ctx.post_num_ranks == 0
    with pytest.raises(ValueError, match="multiple of world_size"):
        build_cp_context(torch.tensor([0, 10]), rank=0, world_size=4)
    with pytest.raises(ValueError, match="rank: expected an integer in"):
        build_cp_context(cu, rank=4, world_size=4)


def test_context_layout_matches_fla():
    """Our contexts hold what FLA's get_cp_cu_seqlens builds, in both layouts."""
    context = pytest.importorskip("fla.ops.cp.context", reason="fla-core is not installed")
    fields = ("pre_num_ranks", "post_num_ranks", "part_len", "front_num_seqs", "pre_num_ranks_by_part",
              "post_num_ranks_by_part")
    for cu in ([0, T], [0, 20, 130, T], [0, 48, 96, 96, 144, T], CASES["many_short"]["cu"]):
        for layout in ("contiguous", "zigzag"):
            for world in WORLD_SIZES:
                for rank in range(world):
                    theirs = context.get_cp_cu_seqlens(torch.tensor(cu), world_size=world, rank=rank, layout=layout)
                    ours = build_cp_context(torch.tensor(cu), rank=rank, world_size=world, layout=layout)
                    where = (cu, layout, world, rank)
                    assert ours.cu_seqlens.tolist() == theirs.cu_seqlens.tolist(), where
                    assert ours.layout == theirs.layout, where
                    for name in fields:
                        if layout == "zigzag" or name in ("pre_num_ranks", "post_num_ranks"):
                            assert getattr(ours, name) == getattr(theirs, name), (where, name)
    with pytest.raises(ValueError, match="multiple of 2 world_size"):
        build_cp_context(torch.tensor([0, 12]), rank=0, world_size=4, layout="zigzag")
    with pytest.raises(ValueError, match="layout: expected 'contiguous' or 'zigzag'"):
        build_cp_context(torch.tensor([0, T]), rank=0, world_size=2, layout="diagonal")


def _invalid_contexts(rank, world, cases, device):
    """What a rank raises for contexts whose metadata do not fit its tokens or the group (world 2)."""
    zigzag = build_cp_context(torch.tensor([0, 30, 101, 150, T]), layout="zigzag")
    contiguous = build_cp_context(torch.tensor([0, 100, T]))  # rank 0 continues on 1, 1 from 0
    # The offsets of FLA's graph mode: padded with empty sequences (here at both ends).
    padded = torch.tensor([0, 0] + contiguous.cu_seqlens.tolist()[1:] + [T // world])
    x = torch.randn(1, T // world, 2, 16, dtype=torch.float64)
    beta = torch.rand(1, T // world, 2, dtype=torch.float64)
    raised = {}
    for name, ctx in (("part_len", dataclasses.replace(zigzag, part_len=zigzag.part_len + 1)),
                      ("front_num_seqs", dataclasses.replace(zigzag, front_num_seqs=zigzag.num_seqs)),
                      ("pre", dataclasses.replace(zigzag, pre_num_ranks_by_part=(2 * world, 0))),
                      ("by_part", dataclasses.replace(zigzag, post_num_ranks_by_part=None)),
                      ("padded", dataclasses.replace(contiguous, cu_seqlens=padded, cu_seqlens_cpu=padded)),
                      # Only rank 1 sees this one (slots 1 and 2 adjacent); rank 0 would wait in the exchange.
                      ("middle", dataclasses.replace(zigzag, pre_num_ranks_by_part=(zigzag.pre_num_ranks_by_part[0],
                                                                                   0)) if rank == 1 else None)):
        if ctx is None:
            continue
        try:
            fkt.chunk_kda(x, x, x, x, beta, cp_context=ctx)
            raised[name] = None
        except ValueError as e:
            raised[name] = str(e)
    return dict(raised=raised, middle_post=zigzag.post_num_ranks_by_part[0])


def test_invalid_contexts_raise():
    for rank, result in enumerate(run_world(2, "gloo", {}, timeout_s=120, body=_invalid_contexts)):
        raised = result["raised"]
        assert "two parts of part_len" in raised["part_len"], rank
        assert "two parts of part_len" in raised["front_num_seqs"], rank
        assert "do not fit slots" in raised["pre"], rank
        assert "needs pre_num_ranks_by_part and post_num_ranks_by_part" in raised["by_part"], rank
        assert "is empty here" in raised["padded"], rank
        if rank == 1:  # slots 1 and 2: its first part's last sequence continues into its second
            assert result["middle_post"] > 0 and "are adjacent" in raised["middle"], rank


def test_fla_rules_raise_value_errors():
    x, kw, _, cu, _ = make_case("ragged")
    ctx = build_cp_context(cu, rank=0, world_size=2)
    args = [x[n][:, :96] for n in ("q", "k", "v", "g", "beta")]
    with pytest.raises(ValueError, match="initial_state: must be None with cp_context"):
        fkt.chunk_kda(*args, initial_state=torch.zeros(2, 2, 16, 8, dtype=torch.float64), cp_context=ctx, **kw)
    with pytest.raises(ValueError, match="output_final_state: must be False with cp_context"):
        fkt.chunk_kda(*args, output_final_state=True, cp_context=ctx, **kw)
    with pytest.raises(ValueError, match="cu_seqlens .* must be set"):
        fkt.chunk_kda(*args, cp_context=CPContext(), **kw)
    with pytest.raises(ValueError, match="initialised torch.distributed"):
        fkt.chunk_kda(*args, cp_context=ctx, **kw)
    with pytest.raises(ValueError, match="layout 'diagonal' is not supported"):
        fkt.chunk_kda(*args, cp_context=dataclasses.replace(ctx, layout="diagonal"), **kw)
    with pytest.raises(ValueError, match="use_graph: not supported with cu_seqlens or cp_context"):
        fkt.chunk_kda(*args, cp_context=ctx, use_graph=True, **kw)


def test_invalid_call_raises_on_every_rank_before_the_exchange():
    """A call every rank makes wrongly raises on every rank at once, naming the argument: no rank waits
    in the exchange for a rank that failed before it (the hang a summarising rank's error caused)."""
    results = run_world(2, "gloo", {}, timeout_s=120, body=_invalid_call)
    assert [r["post_num_ranks"] for r in results] == [1, 0]
    for rank, r in enumerate(results):
        assert r["raised"] is not None and r["raised"].startswith("ValueError") and "A_log" in r["raised"], rank
        assert r["seconds"] < 10, f"rank {rank} raised after {r['seconds']:.1f} s"
