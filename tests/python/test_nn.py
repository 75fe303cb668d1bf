"""flash_kda_train.nn.KimiDeltaAttention: FLA's parameter names and shapes, and its plumbing
(projections, short convolution, gate/beta wiring, gated norm, output projection, padding)
checked against an independent plain-torch composition whose attention is the fp64 gold."""

import math

import pytest
import torch
import torch.nn.functional as F

from flash_kda_train import reference
from flash_kda_train.nn import FusedRMSNormGated, KimiDeltaAttention

CONFIGS = {
    "gva-expandv-convbias": dict(hidden_size=48, head_dim=8, num_heads=2, num_v_heads=4, expand_v=2, conv_bias=True),
    "plain": dict(hidden_size=32, head_dim=16, num_heads=2),
    "noconv-safegate": dict(hidden_size=32, head_dim=8, num_heads=2, use_short_conv=False, safe_gate=True,
                            lower_bound=-5.0),
    "negeig-conv3": dict(hidden_size=24, head_dim=8, num_heads=1, num_v_heads=2, allow_neg_eigval=True, conv_size=3),
}


def fla_state_dict_shapes(hidden_size, head_dim, num_heads, num_v_heads=None, expand_v=1, use_short_conv=True,
                          conv_size=4, conv_bias=False, **_):
    """The parameters of FLA's layer, written out from fla/layers/kda.py (KimiDeltaAttention.__init__)
    and the modules it builds (fla/modules/conv/short_conv.py ShortConvolution: an nn.Conv1d with
    groups=hidden_size; fla/modules/fused_norm_gate.py FusedRMSNormGated: weight, bias=None) at
    flash-linear-attention commit bc3b101dcb713ddc5bd8924b66754eb68b5ccf89 (the commit of kda-math.md)."""
    HV = num_v_heads or num_heads
    K, V = head_dim, int(head_dim * expand_v)
    key_dim, value_dim, gate_dim = num_heads * K, HV * V, HV * K
    shapes = {
        "A_log": (HV,),                      # per value head (native GVA)
        "dt_bias": (gate_dim,),              # HV * K
        "q_proj.weight": (key_dim, hidden_size),
        "k_proj.weight": (key_dim, hidden_size),
        "v_proj.weight": (value_dim, hidden_size),
    }
    if use_short_conv:
        for name, dim in (("q_conv1d", key_dim), ("k_conv1d", key_dim), ("v_conv1d", value_dim)):
            shapes[f"{name}.weight"] = (dim, 1, conv_size)
            if conv_bias:
                shapes[f"{name}.bias"] = (dim,)
    shapes.update({
        "f_proj.0.weight": (V, hidden_size),  # low-rank gate projection: hidden -> head_v_dim -> HV*K
        "f_proj.1.weight": (gate_dim, V),
        "b_proj.weight": (HV, hidden_size),
        "g_proj.0.weight": (V, hidden_size),  # output gate: hidden -> head_v_dim -> HV*V (+ bias)
        "g_proj.1.weight": (value_dim, V),
        "g_proj.1.bias": (value_dim,),
        "o_norm.weight": (V,),
        "o_proj.weight": (hidden_size, value_dim),
    })
    return shapes


@pytest.mark.parametrize("name", list(CONFIGS))
def test_state_dict_matches_fla(name):
    config = CONFIGS[name]
    layer = KimiDeltaAttention(**config)
    expected = fla_state_dict_shapes(**config)
    got = {n: tuple(t.shape) for n, t in layer.state_dict().items()}
    assert got == expected
    # The ordering of FLA's state_dict (A_log, dt_bias first: direct parameters precede submodules).
    assert list(got) == list(expected)
    assert all(t.dtype == torch.float32 for t in layer.state_dict().values())
    # An FLA checkpoint of that layout loads strictly, and its values land where they belong.
    checkpoint = {n: torch.randn(shape) for n, shape in expected.items()}
    layer.load_state_dict(checkpoint, strict=True)
    assert all(torch.equal(layer.state_dict()[n], t) for n, t in checkpoint.items())


def test_state_dict_from_fla_itself():
    """When FLA is installed, a state_dict of FLA's own layer loads strictly and round-trips."""
    pytest.importorskip("einops")
    try:
        import importlib
        import pathlib
        import sys
        import types

        import fla
        # fla.layers/__init__ imports every layer (and transformers); load only the KDA one.
        if "fla.layers" not in sys.modules:
            package = types.ModuleType("fla.layers")
            package.__path__ = [str(pathlib.Path(fla.__file__).parent / "layers")]
            sys.modules["fla.layers"] = package
        FLAKimiDeltaAttention = importlib.import_module("fla.layers.kda").KimiDeltaAttention
    except ImportError as e:
        pytest.skip(f"FLA not importable here: {e}")
    for config in CONFIGS.values():
        torch.manual_seed(0)
        theirs = FLAKimiDeltaAttention(**config)
        torch.manual_seed(0)
        ours = KimiDeltaAttention(**config)
        # The same seed gives the same weights: the random draws come in FLA's order.
        assert all(torch.equal(t, ours.state_dict()[n]) for n, t in theirs.state_dict().items())
        ours.load_state_dict(theirs.state_dict(), strict=True)
        theirs.load_state_dict(ours.state_dict(), strict=True)
        assert list(ours.state_dict()) == list(theirs.state_dict())


def test_random_draws_come_in_fla_order():
    """FLA draws A_log (unless safe_gate zeroes it) and dt_bias after b_proj and before g_proj
    (fla/layers/kda.py), so with one seed the parameters before them do not depend on safe_gate and
    those after do: A_log's draws shift them."""
    config = dict(hidden_size=32, head_dim=16, num_heads=2)
    torch.manual_seed(3)
    drawn = KimiDeltaAttention(**config).state_dict()
    torch.manual_seed(3)
    zero = KimiDeltaAttention(**config, safe_gate=True, lower_bound=-5.0).state_dict()
    before = ("q_proj", "k_proj", "v_proj", "q_conv1d", "k_conv1d", "v_conv1d", "f_proj", "b_proj")
    for name, t in drawn.items():
        if name.startswith(before):
            assert torch.equal(t, zero[name]), name
        elif name.startswith(("g_proj", "o_proj")):
            assert not torch.equal(t, zero[name]), name


def test_gate_initialisation_follows_fla():
    torch.manual_seed(1)
    layer = KimiDeltaAttention(hidden_size=32, head_dim=16, num_heads=4, num_v_heads=8)
    A = layer.A_log.exp()
    assert A.min() >= 1 and A.max() <= 16
    dt = F.softplus(layer.dt_bias.double())  # dt_bias = softplus^-1(dt), dt log-uniform in [1e-3, 1e-1]
    assert dt.min() >= 1e-4 - 1e-12 and dt.max() <= 0.1 + 1e-9
    assert layer.A_log._no_weight_decay and layer.dt_bias._no_weight_decay
    assert torch.equal(KimiDeltaAttention(hidden_size=32, head_dim=16, num_heads=2, safe_gate=True,
                                          lower_bound=-5.0).A_log, torch.zeros(2))
    assert torch.equal(layer.o_norm.weight, torch.ones(16))


def test_forward_backward_cpu():
    torch.manual_seed(2)
    layer = KimiDeltaAttention(**CONFIGS["gva-expandv-convbias"])
    x = torch.randn(2, 77, 48, requires_grad=True)
    out, attentions, cache = layer(x)
    assert out.shape == x.shape and attentions is None and cache is None
    out.square().mean().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    for name, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_bfloat16_layer_runs():
    torch.manual_seed(3)
    layer = KimiDeltaAttention(**CONFIGS["plain"]).to(torch.bfloat16)
    x = torch.randn(1, 70, 32, dtype=torch.bfloat16, requires_grad=True)
    out, _, _ = layer(x)
    assert out.dtype == torch.bfloat16
    out.float().square().sum().backward()
    assert torch.isfinite(x.grad.float()).all()


# ---- the independent composition: plain torch around the fp64 gold ------------------------------

class _GoldKDA(torch.autograd.Function):
    """The fp64 token-by-token gold as an autograd function (its exact backward)."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, A_log, dt_bias, options):
        o, _, _ = reference.gold(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, output_final_state=False, **options)
        ctx.save_for_backward(q, k, v, g, beta, A_log, dt_bias)
        ctx.options = options
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, g, beta, A_log, dt_bias = ctx.saved_tensors
        _, _, grads = reference.gold(q, k, v, g, beta, do=do.contiguous(), A_log=A_log, dt_bias=dt_bias,
                                     output_final_state=False, **ctx.options)
        return grads.dq, grads.dk, grads.dv, grads.dg, grads.dbeta, grads.dA_log, grads.ddt_bias, None


def _causal_conv(x, conv, lengths):
    """Depthwise causal conv + SiLU with F.conv1d, one sequence at a time (x: [1 or B, T, D])."""
    if conv is None:
        return F.silu(x)
    weight, bias, width = conv.weight, conv.bias, conv.weight.shape[-1]
    outs = []
    for row in range(x.shape[0]):
        start = 0
        for n in lengths[row]:
            if n == 0:
                continue
            seq = x[row, start:start + n].t().unsqueeze(0)  # [1, D, n]
            y = F.conv1d(seq, weight, bias, padding=width - 1, groups=weight.shape[0])[..., :n]
            outs.append(F.silu(y)[0].t())
            start += n
    return torch.cat(outs).view_as(x)


def _composition(layer, x, cu_seqlens=None):
    """What FLA's layer computes, spelled out step by step, with the gold for the attention."""
    B, T, _ = x.shape
    lengths = [[T]] * B if cu_seqlens is None else [torch.diff(cu_seqlens).tolist()]
    conv = (lambda name: getattr(layer, name)) if layer.use_short_conv else (lambda name: None)
    q = _causal_conv(F.linear(x, layer.q_proj.weight), conv("q_conv1d"), lengths)
    k = _causal_conv(F.linear(x, layer.k_proj.weight), conv("k_conv1d"), lengths)
    v = _causal_conv(F.linear(x, layer.v_proj.weight), conv("v_conv1d"), lengths)
    g = F.linear(F.linear(x, layer.f_proj[0].weight), layer.f_proj[1].weight)
    beta = F.linear(x, layer.b_proj.weight)
    K, V, H, HV = layer.head_k_dim, layer.head_v_dim, layer.num_heads, layer.num_v_heads
    q, k = q.reshape(B, T, H, K), k.reshape(B, T, H, K)
    v, g = v.reshape(B, T, HV, V), g.reshape(B, T, HV, K)
    options = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                   allow_neg_eigval=layer.allow_neg_eigval, safe_gate=layer.safe_gate, lower_bound=layer.lower_bound,
                   state_v_first=True, cu_seqlens=cu_seqlens)
    o = _GoldKDA.apply(q, k, v, g, beta, layer.A_log, layer.dt_bias, options)
    gate = F.linear(F.linear(x, layer.g_proj[0].weight), layer.g_proj[1].weight, layer.g_proj[1].bias)
    gate = gate.reshape(B, T, HV, V)
    normed = o * torch.rsqrt(o.square().mean(-1, keepdim=True) + layer.o_norm.eps) * layer.o_norm.weight
    return F.linear((normed * torch.sigmoid(gate)).reshape(B, T, HV * V), layer.o_proj.weight)


def _randomise(layer):
    """Random values everywhere (norm weight and gate bias included), and a gate in a useful range."""
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * (0.5 if p.dim() < 2 else 1.0 / math.sqrt(p.shape[-1])))
        layer.A_log.mul_(0.5)


@pytest.mark.parametrize("name,varlen", [(name, False) for name in CONFIGS] + [("gva-expandv-convbias", True),
                                                                               ("noconv-safegate", True)])
def test_layer_equals_composition_with_gold(name, varlen):
    torch.manual_seed(4)
    layer = KimiDeltaAttention(**CONFIGS[name], backend="cpu").double()
    _randomise(layer)
    hidden = layer.hidden_size
    if varlen:
        cu_seqlens = torch.tensor([0, 5, 5, 70, 133], dtype=torch.int64)  # an empty sequence, chunk crossings
        x = torch.randn(1, 133, hidden, dtype=torch.float64, requires_grad=True)
    else:
        cu_seqlens = None
        x = torch.randn(2, 71, hidden, dtype=torch.float64, requires_grad=True)
    kwargs = {} if cu_seqlens is None else dict(cu_seqlens=cu_seqlens)
    out, _, _ = layer(x, **kwargs)
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    ours = {n: p.grad.clone() for n, p in layer.named_parameters()}
    ours["x"] = x.grad.clone()

    layer.zero_grad()
    x.grad = None
    ref = _composition(layer, x, cu_seqlens)
    (ref * weights).sum().backward()
    theirs = {n: p.grad for n, p in layer.named_parameters()}
    theirs["x"] = x.grad

    assert (out - ref).norm() / ref.norm() < 1e-12
    assert ours.keys() == theirs.keys()
    for n in ours:
        err = (ours[n] - theirs[n]).norm() / theirs[n].norm().clamp_min(1e-300)
        assert err < 1e-10, f"{n}: relative error {err:.2e}"


def test_attention_mask_packs_sequences():
    """A left- and right-padded batch equals each sequence run alone; padded outputs are zero."""
    torch.manual_seed(5)
    layer = KimiDeltaAttention(**CONFIGS["gva-expandv-convbias"]).double()
    _randomise(layer)
    x = torch.randn(3, 40, layer.hidden_size, dtype=torch.float64)
    mask = torch.ones(3, 40, dtype=torch.int64)
    mask[0, :7] = 0   # left padding
    mask[2, 33:] = 0  # right padding
    out, _, _ = layer(x, attention_mask=mask)
    for row in range(3):
        valid = mask[row].bool()
        alone, _, _ = layer(x[row:row + 1, valid])
        torch.testing.assert_close(out[row, valid], alone[0], rtol=1e-12, atol=1e-12)
        assert torch.all(out[row, ~valid] == 0)


def test_host_offsets_are_passed_to_chunk_kda():
    """cu_seqlens_cpu reaches chunk_kda as the planner's offsets: host offsets that disagree with
    cu_seqlens are refused there (on the CPU the planner compares the two), and agreeing ones give
    the result of cu_seqlens alone."""
    torch.manual_seed(6)
    layer = KimiDeltaAttention(**CONFIGS["plain"], backend="cpu").double()
    _randomise(layer)
    x = torch.randn(1, 70, layer.hidden_size, dtype=torch.float64)
    split = torch.tensor([0, 30, 70])
    with pytest.raises(ValueError, match="cu_seqlens: expected the offsets of its host copy cu_seqlens_cpu"):
        layer(x, cu_seqlens=split, cu_seqlens_cpu=torch.tensor([0, 40, 70]))
    reference, _, _ = layer(x, cu_seqlens=split, cu_seqlens_cpu=split.clone())
    torch.testing.assert_close(reference, layer(x, cu_seqlens=split)[0], rtol=0, atol=0)


def test_rejects_decoding_cache():
    layer = KimiDeltaAttention(**CONFIGS["plain"])
    with pytest.raises(NotImplementedError, match="past_key_values"):
        layer(torch.randn(1, 8, 32), past_key_values=object())


def test_gated_norm_residual_and_prenorm_follow_fla():
    """FusedRMSNormGated's residual is added in float32 before the norm; prenorm=True returns the sum
    as well, in the residual's dtype (FLA's fla/modules/norm/fused_norm_gate.py)."""
    torch.manual_seed(4)
    norm = FusedRMSNormGated(8, activation="sigmoid")
    x, g, r = (torch.randn(2, 3, 8).to(torch.bfloat16) for _ in range(3))
    y = norm(x, g, residual=r)
    s = x.float() + r.float()
    expected = s * torch.rsqrt(s.square().mean(-1, keepdim=True) + norm.eps) * torch.sigmoid(g.float())
    assert y.dtype == torch.bfloat16 and torch.equal(y, expected.to(torch.bfloat16))
    y2, summed = norm(x, g, residual=r, prenorm=True)
    assert torch.equal(y2, y) and summed.dtype == torch.bfloat16 and torch.equal(summed, s.to(torch.bfloat16))
    y3, passed = norm(x, g, prenorm=True)
    assert passed is x and torch.equal(y3, norm(x, g))
    assert norm(x, g, prenorm=True, residual_in_fp32=True)[1].dtype == torch.float32

