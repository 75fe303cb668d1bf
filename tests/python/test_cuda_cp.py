"""Context parallelism on CUDA (H200): the summaries and the fold against the CPU backend on the same
inputs (relative RMS < 1e-5, S_ext and M parts separately), determinism and CUDA-graph capture, the
CUDA-only refusals, and the CP op over NCCL with 2 to 4 GPUs against the single-device result
(the cases of test_cp.py in float32: outputs and every gradient within 1e-5)."""

import functools

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from flash_kda_train import _core, cp
from kda_cases import capture_graph, needs_cuda, rel_rms
from test_cp import CASES, check_errors, run_world

pytestmark = needs_cuda

# name -> (shape and options, summarised sequence). Weak decay (0.05 * logsigmoid) so that M does not
# vanish over a sequence and its comparison means something.
SUMMARY_CASES = {
    "dense_fp32_k64": (dict(B=2, T=150, K=64, V=64), 1),
    "dense_bf16_k128_v64": (dict(B=2, T=130, K=128, V=64, dtype=torch.bfloat16), 1),
    "dense_fp32_k128": (dict(B=1, T=200, K=128, V=128), 0),
    "varlen_fp32_gva": (dict(cu=[0, 40, 41, 200, 300], H=1, HV=4, K=64, V=64), 2),
    "varlen_bf16_gate_l2norm": (dict(cu=[0, 100, 100, 257], K=128, V=64, dtype=torch.bfloat16, gate=True,
                                     l2norm=True, beta_logits=True), 2),
    "varlen_chunk32_vfirst": (dict(cu=[0, 7, 150], K=32, V=96, chunk_size=32, state_v_first=True), 1),
    "varlen_empty": (dict(cu=[0, 60, 60, 100], K=64, V=32), 1),
}


def summary_inputs(spec, seed=0):
    """(cfg, inputs, d_o) on the CPU for one summary case."""
    spec = {**dict(B=1, T=None, H=2, HV=None, dtype=torch.float32, gate=False, l2norm=False, beta_logits=False,
                   chunk_size=64, state_v_first=False, cu=None), **spec}
    gen = torch.Generator().manual_seed(seed)
    cu = spec["cu"]
    B, T = spec["B"], spec["T"] if cu is None else cu[-1]
    H, HV, K, V, dtype = spec["H"], spec["HV"] or spec["H"], spec["K"], spec["V"], spec["dtype"]

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    k = randn(B, T, H, K)
    g = randn(B, T, HV, K) - 5.0 if spec["gate"] else 0.05 * F.logsigmoid(randn(B, T, HV, K))
    inputs = _core.Inputs(
        q=randn(B, T, H, K).to(dtype), k=(k if spec["l2norm"] else F.normalize(k, dim=-1)).to(dtype),
        v=randn(B, T, HV, V).to(dtype), g=g.to(dtype),
        beta=(randn(B, T, HV) if spec["beta_logits"] else torch.sigmoid(randn(B, T, HV))).to(dtype),
        A_log=0.5 * randn(HV) if spec["gate"] else None, dt_bias=randn(HV * K) if spec["gate"] else None,
        cu_seqlens=torch.tensor(cu, dtype=torch.int64) if cu is not None else None,
        cu_seqlens_cpu=torch.tensor(cu, dtype=torch.int64) if cu is not None else None)
    cfg = _core.Config(scale=K ** -0.5, chunk_size=spec["chunk_size"], use_qk_l2norm_in_kernel=spec["l2norm"],
                       use_gate_in_kernel=spec["gate"], use_beta_sigmoid_in_kernel=spec["beta_logits"],
                       lower_bound=-5.0 if spec["gate"] else None, safe_gate=spec["gate"],
                       state_v_first=spec["state_v_first"])
    return cfg, inputs, randn(B, T, HV, V).to(dtype)


def on_cuda(inputs):
    """The inputs on the GPU, with the host offsets kept on the host."""
    moved = {n: (t.cuda() if t is not None and n != "cu_seqlens_cpu" else t) for n, t in inputs._asdict().items()}
    return _core.Inputs(**moved)


def assert_summary_close(got, ref, V, what):
    got = got.cpu()
    assert not got.isnan().any(), what
    for part, cols in (("S_ext", slice(0, V)), ("M", slice(V, None))):
        err = rel_rms(got[..., cols], ref[..., cols])
        assert err < 1e-5, f"{what} {part}: rel RMS {err:.3e}"


@pytest.mark.parametrize("name", list(SUMMARY_CASES))
def test_summaries_match_cpu_backend(name, poisoned):
    spec, sequence = SUMMARY_CASES[name]
    cfg, inputs, d_o = summary_inputs(spec)
    V = inputs.v.shape[-1]
    gpu = on_cuda(inputs)
    forward = cp.forward_summary(cfg, gpu, sequence)
    backward = cp.backward_summary(cfg, gpu, d_o.cuda(), sequence)
    assert forward.dtype == backward.dtype == torch.float32 and forward.is_cuda
    assert_summary_close(forward, cp.forward_summary(cfg, inputs, sequence), V, "forward")
    assert_summary_close(backward, cp.backward_summary(cfg, inputs, d_o, sequence), V, "backward")
    # Bitwise deterministic.
    assert torch.equal(forward, cp.forward_summary(cfg, gpu, sequence))
    assert torch.equal(backward, cp.backward_summary(cfg, gpu, d_o.cuda(), sequence))


def test_empty_sequence_summary_is_the_identity_map():
    cfg, inputs, d_o = summary_inputs(SUMMARY_CASES["varlen_empty"][0])
    K, V = inputs.q.shape[-1], inputs.v.shape[-1]
    gpu = on_cuda(inputs)
    identity = torch.cat([torch.zeros(K, V), torch.eye(K)], dim=1).expand(inputs.v.shape[2], K, V + K)
    assert torch.equal(cp.forward_summary(cfg, gpu, 1).cpu(), identity)
    assert torch.equal(cp.backward_summary(cfg, gpu, d_o.cuda(), 1).cpu(), identity)


def random_summaries(R, HV, K, V, seed):
    """Gathered summaries whose maps are contractions (norm ~ 0.8), as decaying states' maps are."""
    gen = torch.Generator().manual_seed(seed)
    s = torch.randn(R, HV, K, V + K, generator=gen)
    s[..., V:] *= 0.4 / K ** 0.5
    return s


@pytest.mark.parametrize("K,V", [(128, 64), (64, 128), (16, 40)])
@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("state_v_first", [False, True])
def test_fold_matches_cpu_fold(K, V, backward, state_v_first):
    sums = random_summaries(4, 3, K, V, seed=K + V)
    shape = (3, V, K) if state_v_first else (3, K, V)
    for first, count in ((0, 4), (1, 2), (3, 1), (2, 0)):
        ref = cp.fold(sums, first, count, backward, state_v_first, torch.empty(shape))
        got = cp.fold(sums.cuda(), first, count, backward, state_v_first, torch.full(shape, float("nan")).cuda())
        if count == 0:
            assert torch.equal(got.cpu(), torch.zeros(shape))
        else:
            assert rel_rms(got.cpu(), ref) < 1e-5, (first, count)


def test_summaries_and_fold_capture_in_a_cuda_graph():
    cfg, inputs, d_o = summary_inputs(dict(cu=[0, 70, 200], H=2, HV=4, K=64, V=64))
    gpu, d_o = on_cuda(inputs), d_o.cuda()

    def step():
        fwd = cp.forward_summary(cfg, gpu, 1)
        bwd = cp.backward_summary(cfg, gpu, d_o, 0)
        state = cp.fold(torch.stack([fwd, fwd]), 0, 2, False, False, torch.empty(4, 64, 64, device="cuda"))
        return fwd, bwd, state

    graph, captured = capture_graph(step)
    d_o.copy_(torch.randn_like(d_o))
    graph.replay()
    eager = step()
    torch.cuda.synchronize()
    for a, b in zip(captured, eager):
        assert torch.equal(a, b)


def test_cuda_refusals():
    with pytest.raises(ValueError, match=r"summaries: the CUDA fold reads float32 summaries \(the state dtype of "
                                         r"the CUDA backend\), got float64"):
        cp.fold(torch.zeros(2, 1, 8, 16, dtype=torch.float64, device="cuda"), 0, 1, False, False,
                torch.empty(1, 8, 8, dtype=torch.float64, device="cuda"))
    with pytest.raises(ValueError, match=r"summaries: the CUDA fold supports the summaries of the CUDA backend, "
                                         r"K, V <= 128"):
        cp.fold(torch.zeros(2, 1, 160, 168, device="cuda"), 0, 1, False, False, torch.empty(1, 160, 8, device="cuda"))
    with pytest.raises(ValueError, match=r"state: expected a tensor on cuda:0 \(the device of the summaries\), "
                                         r"got one on cpu"):
        cp.fold(torch.zeros(2, 1, 8, 16, device="cuda:0"), 0, 1, False, False, torch.empty(1, 8, 8))
    cfg, inputs, _ = summary_inputs(dict(B=1, T=8, K=160, V=16))
    with pytest.raises(ValueError, match=r"head dims K, V <= 128, got K = 160"):
        cp.forward_summary(cfg, on_cuda(inputs), 0)


# The CP op over NCCL: the Gloo cases of test_cp.py in float32, one GPU per rank.
NCCL_CASES = {name: {**spec, "dtype": torch.float32} for name, spec in CASES.items()}


@functools.lru_cache(maxsize=None)
def launch_nccl():
    return run_world(min(4, torch.cuda.device_count()), "nccl", NCCL_CASES, timeout_s=600)


@pytest.mark.skipif(torch.cuda.device_count() < 2 or not dist.is_nccl_available(),
                    reason="needs at least 2 GPUs and NCCL")
@pytest.mark.parametrize("name", list(NCCL_CASES))
def test_nccl_outputs_and_gradients_match_single_device(name):
    for rank, results in enumerate(launch_nccl()):
        check_errors(rank, results[name])
