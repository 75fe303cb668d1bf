"""Stage F1 (gate activation + chunk-local cumsum, kda-math.md sections 2.2, 3.3 and 5) through the
fkt_stage_gate_cumsum test hook: the CUDA kernel against its CPU twin on the same inputs, and the
CPU twin against an fp64 evaluation of the formulas.

"""

import ctypes

import pytest
import torch

from flash_kda_train import _abi, _core, _lib

LIB = _lib.lib
_Options = _lib.Options


def _cuda_skip_reason():
    if not torch.cuda.is_available():
        return "torch.cuda is not available (no GPU)"
    if not LIB.fkt_has_cuda():
        return "the library was built without the CUDA backend (fkt_has_cuda() == 0)"
    return None


requires_cuda = pytest.mark.skipif(_cuda_skip_reason() is not None, reason=str(_cuda_skip_reason()))


def stage_gate_cumsum(tensors, options, gamma=None):
    """Runs the hook on the device of q; gamma defaults to a NaN-poisoned [B, T, HV, K] fp32 tensor."""
    g = tensors["g"]
    if gamma is None:
        gamma = torch.full(g.shape, float("nan"), dtype=torch.float32, device=g.device)
    inputs = _abi.describe_all(_core.TORCH, _lib.INPUT_NAMES, [tensors.get(name) for name in _lib.INPUT_NAMES])
    out = _abi.describe_all(_core.TORCH, ("gamma",), (gamma,))
    stream = torch.cuda.current_stream(g.device).cuda_stream if g.is_cuda else None
    _lib.check(LIB.fkt_stage_gate_cumsum(inputs.address, ctypes.byref(options), out.tensor(0), stream))
    if g.is_cuda:
        torch.cuda.synchronize(g.device)
    return gamma


# (use_gate_in_kernel, has A_log, has dt_bias, lower_bound or None); kda-math.md section 2.2
GATES = {
    "G0": (False, False, False, None),
    "G1": (True, True, True, None),
    "G1-no-dt_bias": (True, True, False, None),
    "G2": (True, True, True, -5.0),
    "G2-no-A_log": (True, False, True, -3.0),
}
# Ragged sequence lengths: empty ones (first, inside, last), several sequences inside one chunk-sized
# window of tokens, and lengths just below, at and above the chunk sizes 32 and 64.
_RAGGED = [0, 1, 1, 0, 3, 65, 1, 64, 63, 0, 130, 2, 33, 7, 0]
# name -> (B, T, cu_seqlens or None); partial last chunks everywhere
LAYOUTS = {
    "dense": (2, 200, None),
    "varlen-int32": (1, 300, torch.tensor([0, 1, 64, 65, 300], dtype=torch.int32)),
    "varlen-int64": (1, 300, torch.tensor([0, 1, 64, 65, 300], dtype=torch.int64)),
    "varlen-ragged": (1, sum(_RAGGED), torch.tensor([0, *_RAGGED], dtype=torch.int32).cumsum(0, dtype=torch.int32)),
}
HV, H, V = 4, 2, 32


def make_case(gate, layout, K, g_dtype, param_dtype=torch.float32, chunk=64, seed=0):
    """CPU tensors and options of one call; only g, A_log, dt_bias and cu_seqlens matter to F1."""
    gate_in_kernel, has_A_log, has_dt_bias, lower_bound = GATES[gate]
    B, T, cu_seqlens = LAYOUTS[layout]
    gen = torch.Generator().manual_seed(seed)
    if gate_in_kernel:
        # wide enough that g + dt_bias crosses the softplus threshold 20 for some elements
        g = 8.0 * torch.randn(B, T, HV, K, generator=gen)
    else:
        g = torch.nn.functional.logsigmoid(4.0 * torch.randn(B, T, HV, K, generator=gen))
    tensors = {
        "q": torch.randn(B, T, H, K, generator=gen).to(torch.bfloat16),
        "k": torch.randn(B, T, H, K, generator=gen).to(torch.bfloat16),
        "v": torch.randn(B, T, HV, V, generator=gen).to(torch.bfloat16),
        "g": g.to(g_dtype),
        "beta": torch.rand(B, T, HV, generator=gen).to(torch.bfloat16),
        "A_log": torch.empty(HV).uniform_(0.0, 2.7, generator=gen).to(param_dtype) if has_A_log else None,
        "dt_bias": torch.randn(HV * K, generator=gen).to(param_dtype) if has_dt_bias else None,
        "cu_seqlens": cu_seqlens,
        "cu_seqlens_cpu": cu_seqlens,
    }
    options = _Options(
        scale=K**-0.5,
        lower_bound=lower_bound if lower_bound is not None else 0.0,
        has_lower_bound=int(lower_bound is not None),
        chunk_size=chunk,
        use_gate_in_kernel=int(gate_in_kernel),
    )
    return tensors, options


def on_cuda(tensors):
    """The same inputs on the GPU; cu_seqlens_cpu stays on the host for the planner."""
    return {
        name: (t if t is None or name == "cu_seqlens_cpu" else t.cuda()) for name, t in tensors.items()
    }


def reference_gamma(tensors, options):
    """fp64 evaluation of kda-math.md sections 2.2 and 3.3 (Gamma in natural log)."""
    g = tensors["g"].double()
    B, T, _, K = g.shape
    a = g
    if options.use_gate_in_kernel:
        x = g + (tensors["dt_bias"].double().view(HV, K) if tensors["dt_bias"] is not None else 0.0)
        rate = tensors["A_log"].double().exp().view(HV, 1) if tensors["A_log"] is not None else 1.0
        if options.has_lower_bound:
            a = options.lower_bound * torch.sigmoid(rate * x)
        else:
            a = -rate * torch.where(x > 20, x, torch.log1p(torch.exp(x)))
    cu = tensors["cu_seqlens_cpu"]
    sequences = [(b, 0, T) for b in range(B)] if cu is None else [
        (0, int(cu[i]), int(cu[i + 1])) for i in range(len(cu) - 1)
    ]
    gamma = torch.empty_like(a)
    C = options.chunk_size
    for b, begin, end in sequences:
        for first in range(begin, end, C):
            last = min(first + C, end)
            gamma[b, first:last] = a[b, first:last].cumsum(dim=0)
    return gamma


def assert_close(actual, expected, rel):
    """|actual - expected| <= rel * max(1, |expected|) elementwise, with the worst element reported."""
    assert not torch.isnan(actual).any(), "gamma holds NaN: some elements were never written"
    expected = expected.to(actual.dtype)
    excess = (actual - expected).abs() - rel * expected.abs().clamp_min(1.0)
    worst = int(excess.argmax())
    assert excess.max() <= 0, (
        f"element {worst}: got {actual.flatten()[worst].item()}, expected {expected.flatten()[worst].item()} "
        f"(bound {rel} * max(1, |expected|))"
    )


GATE_IDS = list(GATES)
LAYOUT_IDS = list(LAYOUTS)
G_DTYPES = [pytest.param(torch.bfloat16, id="g-bf16"), pytest.param(torch.float32, id="g-fp32")]


@pytest.mark.parametrize("K", [64, 128], ids=lambda K: f"K{K}")
@pytest.mark.parametrize("layout", LAYOUT_IDS)
@pytest.mark.parametrize("gate", GATE_IDS)
def test_cpu_twin_matches_fp64_formula(gate, layout, K):
    tensors, options = make_case(gate, layout, K, torch.float32)
    # the CPU twin computes in fp32; a chunk sums at most 64 terms of one sign
    assert_close(stage_gate_cumsum(tensors, options), reference_gamma(tensors, options), rel=1e-5)


@requires_cuda
@pytest.mark.parametrize("K", [64, 128], ids=lambda K: f"K{K}")
@pytest.mark.parametrize("g_dtype", G_DTYPES)
@pytest.mark.parametrize("layout", LAYOUT_IDS)
@pytest.mark.parametrize("gate", GATE_IDS)
def test_cuda_matches_cpu_twin(gate, layout, g_dtype, K):
    tensors, options = make_case(gate, layout, K, g_dtype)
    expected = stage_gate_cumsum(tensors, options)
    actual = stage_gate_cumsum(on_cuda(tensors), options).cpu()
    # the same fp32 formulas in the same order: only the last bits of expf/log1pf may differ
    assert_close(actual, expected, rel=1e-4)


@requires_cuda
@pytest.mark.parametrize("chunk", [32, 64])
@pytest.mark.parametrize("param_dtype", [torch.bfloat16, torch.float16], ids=["params-bf16", "params-fp16"])
@pytest.mark.parametrize("gate", ["G1", "G2"])
def test_cuda_matches_cpu_twin_fp16_g_and_low_precision_params(gate, param_dtype, chunk):
    tensors, options = make_case(gate, "varlen-int32", 128, torch.float16, param_dtype=param_dtype, chunk=chunk)
    expected = stage_gate_cumsum(tensors, options)
    actual = stage_gate_cumsum(on_cuda(tensors), options).cpu()
    assert_close(actual, expected, rel=1e-4)


def test_rejects_a_gamma_that_is_not_float32():
    tensors, options = make_case("G1", "dense", 64, torch.float32)
    gamma = torch.zeros(tensors["g"].shape, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="gamma: expected float32, got bfloat16"):
        stage_gate_cumsum(tensors, options, gamma)


def test_rejects_a_gamma_of_the_wrong_shape():
    tensors, options = make_case("G0", "varlen-int32", 64, torch.float32)
    gamma = torch.zeros(1, 300, HV, 32)
    with pytest.raises(ValueError, match=r"gamma: expected shape \[B, T, HV, K\] = \[1, 300, 4, 64\], got \[1, 300, 4, 32\]"):
        stage_gate_cumsum(tensors, options, gamma)


@requires_cuda
def test_cuda_varlen_needs_the_device_offsets():
    tensors, options = make_case("G1", "varlen-int32", 64, torch.float32)
    tensors = on_cuda(tensors)
    tensors["cu_seqlens"] = None
    with pytest.raises(ValueError, match="cu_seqlens: CUDA kernels read the sequence offsets on the device"):
        stage_gate_cumsum(tensors, options)


@requires_cuda
def test_cuda_rejects_a_gamma_on_the_host():
    tensors, options = make_case("G0", "dense", 64, torch.float32)
    gamma = torch.zeros(tensors["g"].shape)
    with pytest.raises(ValueError, match=r"gamma: expected a tensor on cuda:0 \(the device of q\), got one on cpu"):
        stage_gate_cumsum(on_cuda(tensors), options, gamma)
