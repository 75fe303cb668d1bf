"""The Python surface: FLA-compatible argument handling, the paired API, the custom op contract."""

import dataclasses
import warnings

import pytest
import torch

import flash_kda_train as fkt
from kda_cases import make_inputs, needs_cuda, rel_rms


def args(x):
    return x["q"], x["k"], x["v"], x["g"], x["beta"]


def op_args(x, scale=0.35, chunk_size=64, l2norm=False, gate=False, **replaced):
    """The positional arguments of the op chunk_kda_fwd for inputs `x` (dense, the final state
    returned); `replaced` overrides inputs by name."""
    x = {**x, **replaced}
    flags = [l2norm, gate, False, False, False, False, False]
    return (x["q"], x["k"], x["v"], x["g"], x["beta"], x["A_log"], x["dt_bias"], x["initial_state"], None, None,
            scale, None, chunk_size, flags, True, "auto", 1)


def bwd_op_args(fwd, d_o, d_final_state, saved):
    """The positional arguments of the op chunk_kda_bwd after chunk_kda_fwd(*fwd)."""
    scale, lower_bound, chunk_size, flags, _, backend, forward_pieces = fwd[10:]
    return (*fwd[:10], d_o, d_final_state, saved, scale, lower_bound, chunk_size, flags, backend, forward_pieces)


def test_paired_api_matches_autograd():
    x = make_inputs(HV=4, gate_in_kernel=True)
    kw = dict(initial_state=x["initial_state"], output_final_state=True, use_gate_in_kernel=True, A_log=x["A_log"],
              dt_bias=x["dt_bias"], use_qk_l2norm_in_kernel=True)
    o, ht = fkt.chunk_kda(*args(x), **kw)
    do, dht = torch.randn_like(o), torch.randn_like(ht)
    torch.autograd.backward([o, ht], [do, dht])
    o2, ht2, ctx = fkt.forward(*args(x), **kw)
    grads = fkt.backward(ctx, do, dht)
    assert torch.equal(o, o2) and torch.equal(ht, ht2)
    for name, leaf in [("dq", "q"), ("dk", "k"), ("dv", "v"), ("dg", "g"), ("dbeta", "beta"), ("dA_log", "A_log"),
                       ("ddt_bias", "dt_bias"), ("dh0", "initial_state")]:
        assert torch.equal(getattr(grads, name), x[leaf].grad), name


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_eager_function_matches_the_custom_op(device):
    """Eager chunk_kda runs ops.EagerChunkKda (no custom-op dispatch per call); torch.compile takes
    the custom op and its registered autograd. Both give the same outputs and every gradient."""
    from flash_kda_train import ops

    x = make_inputs(HV=4, gate_in_kernel=True, requires_grad=False)
    torch.manual_seed(1)
    do, dht = torch.randn_like(x["v"]).to(device), torch.randn_like(x["initial_state"]).to(device)
    results = []
    # EagerChunkKda takes the op's ten tensors, then the Config its options make and output_final_state.
    eager = lambda *a: ops.EagerChunkKda.apply(*a[:10], ops._config(*a[10:14], *a[15:]), a[14])  # noqa: E731
    for call in (eager, lambda *a: torch.ops.flash_kda_train.chunk_kda_fwd(*a)[:2]):
        leaves = {n: t.detach().to(device).requires_grad_() for n, t in x.items() if t is not None}
        o, ht = call(*op_args(leaves, scale=0.25, l2norm=True, gate=True))
        torch.autograd.backward([o, ht], [do, dht])
        results.append([o, ht] + [leaves[n].grad for n in sorted(leaves)])
    for eager, op in zip(*results):
        assert torch.equal(eager, op)


def test_resolved_options_are_shared_only_by_the_same_arguments():
    """chunk_kda's options resolve to one Config (and one C options struct) per set of arguments; other
    arguments, or the same values of other types that the checks tell apart, resolve anew."""
    from flash_kda_train import _abi

    def resolve(scale=None, lower_bound=-5.0, **kwargs):
        return _abi.resolve(16, scale, False, True, False, False, True, lower_bound, False, False, kwargs)[0]

    first = resolve(chunk_size=32)
    assert resolve(chunk_size=32) is first and resolve(chunk_size=32).options() is first.options()
    assert first.chunk_size == 32 and first.lower_bound == -5.0 and first.scale == 16 ** -0.5
    other = resolve(scale=0.5, chunk_size=32)
    assert other is not first and other.scale == 0.5 and other.options().scale == 0.5
    assert resolve(chunk_size=1).chunk_size == 1  # the library refuses it, by value
    pieces = resolve(chunk_size=32, forward_pieces=4)
    assert pieces is not first and pieces.options().forward_pieces == 4 and first.options().forward_pieces == -1
    with pytest.raises(ValueError, match="chunk_size: expected an integer"):
        resolve(chunk_size=True)  # equal to 1 as a key, but a bool
    tensor_scale = torch.tensor(0.25)
    assert resolve(scale=tensor_scale) is not resolve(scale=tensor_scale)  # a tensor's value may change


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_backward_describes_and_plans_the_tensors_it_is_given(device, monkeypatch):
    """The forward hands the backward no description of its inputs (none would survive a
    saved-tensor hook that moves them): the backward describes and plans the saved tensors it gets,
    the forward's own or a hook's copies, and computes the same gradients from either."""
    import contextlib

    from flash_kda_train import _lib

    plans = []
    plan = _lib.lib.fkt_plan_sizes
    monkeypatch.setattr(_lib.lib, "fkt_plan_sizes", lambda *a: plans.append(a) or plan(*a))
    x = make_inputs(HV=4, gate_in_kernel=True, requires_grad=False)
    torch.manual_seed(1)
    do, dht = torch.randn_like(x["v"]).to(device), torch.randn_like(x["initial_state"]).to(device)

    def step(hooks):
        leaves = {n: t.detach().to(device).requires_grad_() for n, t in x.items() if t is not None}
        with hooks:
            o, ht = fkt.chunk_kda(*args(leaves), initial_state=leaves["initial_state"], output_final_state=True,
                                  use_gate_in_kernel=True, A_log=leaves["A_log"], dt_bias=leaves["dt_bias"])
        plans.clear()
        torch.autograd.backward([o, ht], [do, dht])
        return [leaves[n].grad for n in sorted(leaves)], len(plans)

    same, same_plans = step(contextlib.nullcontext())
    copied, copied_plans = step(torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t))
    assert (same_plans, copied_plans) == (1, 1)
    for a, b in zip(same, copied):
        assert torch.equal(a, b)


def test_forward_keeps_its_inputs_only_as_saved_tensors():
    """What a forward leaves for its backward references its inputs only through the saved tensors:
    with a saved-tensor hook that saves copies, an input the caller drops is freed."""
    import gc
    import weakref

    x = make_inputs(HV=4, gate_in_kernel=True, requires_grad=False)
    leaves = {n: t.detach().requires_grad_() for n, t in x.items() if t is not None}
    q = leaves["q"] * 1.0  # not a leaf: only the op and the caller hold it
    alive = weakref.ref(q)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
        o, ht = fkt.chunk_kda(q, *args(leaves)[1:], initial_state=leaves["initial_state"], output_final_state=True,
                              use_gate_in_kernel=True, A_log=leaves["A_log"], dt_bias=leaves["dt_bias"])
    del q
    gc.collect()
    assert alive() is None
    (o.float().sum() + ht.sum()).backward()
    assert leaves["q"].grad is not None and torch.isfinite(leaves["q"].grad).all()


def test_defaults_and_return_values_follow_fla():
    x = make_inputs(requires_grad=False, state=False)
    o, ht = fkt.chunk_kda(*args(x))
    assert ht is None and o.shape == x["v"].shape and o.dtype == x["q"].dtype
    o_scaled, _ = fkt.chunk_kda(*args(x), scale=x["q"].shape[-1] ** -0.5)
    assert torch.equal(o, o_scaled)  # scale=None means K^-0.5


def test_gate_parameters_ignored_without_in_kernel_gate():
    x = make_inputs(requires_grad=False)
    o, _ = fkt.chunk_kda(*args(x))
    o2, _ = fkt.chunk_kda(*args(x), A_log=torch.randn(2), dt_bias=torch.randn(32))
    assert torch.equal(o, o2)


def test_deterministic_bitwise():
    outs = []
    for _ in range(2):
        torch.manual_seed(1)
        x = make_inputs(HV=4, gate_in_kernel=True, B=1, T=150, cu_seqlens=[0, 50, 150])
        o, ht = fkt.chunk_kda(*args(x), initial_state=x["initial_state"], output_final_state=True,
                              use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"], cu_seqlens=x["cu_seqlens"])
        torch.autograd.backward([o, ht], [torch.ones_like(o), torch.ones_like(ht)])
        outs.append([o, ht] + [x[n].grad for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state")])
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_strided_inputs_read_in_place():
    x = make_inputs(requires_grad=False)
    q_t = x["q"].transpose(1, 2).contiguous().transpose(1, 2)  # same values, head-major strides
    assert not q_t.is_contiguous()
    o, _ = fkt.chunk_kda(*args(x))
    o2, _ = fkt.chunk_kda(q_t, *args(x)[1:])
    assert torch.equal(o, o2)


def test_intermediate_states_in_inference_mode():
    x = make_inputs(requires_grad=False, B=1, T=100, cu_seqlens=[0, 30, 100])
    with torch.inference_mode():
        o, ht, h = fkt.chunk_kda(*args(x), initial_state=x["initial_state"], output_final_state=True,
                                 return_intermediate_states=True, cu_seqlens=x["cu_seqlens"])
    # chunks: sequence 0 has 1 (rows 0), sequence 1 has 2 (rows 1, 2); h[:, row] = state entering it
    assert h.shape == (1, 3, 2, 16, 16) and h.dtype == x["q"].dtype
    assert torch.equal(h[0, 0], x["initial_state"][0]) and torch.equal(h[0, 1], x["initial_state"][1])
    # the state entering chunk 1 of sequence 1 is the final state of its first 64 tokens
    _, ht64 = fkt.chunk_kda(*(t[:, 30:94] for t in args(x)), initial_state=x["initial_state"][1:],
                            output_final_state=True)
    assert rel_rms(h[0, 2], ht64[0]) < 1e-6
    with pytest.raises(ValueError, match="inference_mode"):
        fkt.chunk_kda(*args(x), return_intermediate_states=True, cu_seqlens=x["cu_seqlens"])


def test_fla_keyword_handling():
    x = make_inputs(requires_grad=False, K=8, V=24, B=1)
    h0 = x["initial_state"].transpose(-1, -2).contiguous()
    with pytest.warns(DeprecationWarning, match="state_v_first"):
        _, ht = fkt.chunk_kda(*args(x), initial_state=h0, output_final_state=True, transpose_state_layout=True)
    _, ht_ref = fkt.chunk_kda(*args(x), initial_state=h0, output_final_state=True, state_v_first=True)
    assert torch.equal(ht, ht_ref)
    with pytest.raises(ValueError, match="transpose_state_layout"):
        fkt.chunk_kda(*args(x), state_v_first=True, transpose_state_layout=True)
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['bogus'\\]"):
        fkt.chunk_kda(*args(x), bogus=1)
    with pytest.raises(ValueError, match="cp_context: its cu_seqlens"):
        fkt.chunk_kda(*args(x), cp_context=object())  # context parallelism: see test_cp.py
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fkt.chunk_kda(*args(x))


@pytest.mark.parametrize("gate_in_kernel", [False, True])
def test_opcheck(gate_in_kernel):
    x = make_inputs(B=1, T=70, H=1, HV=2, K=8, V=8, gate_in_kernel=gate_in_kernel, requires_grad=True)
    saved = torch.empty(0, dtype=torch.uint8)  # the CPU backend keeps no forward workspace
    sample = op_args(x, gate=gate_in_kernel)
    torch.library.opcheck(torch.ops.flash_kda_train.chunk_kda_fwd.default, sample)
    # The backward op is not itself differentiable (no double backward): check it on plain tensors.
    plain = [t.detach() if isinstance(t, torch.Tensor) else t for t in sample]
    bwd = bwd_op_args(plain, torch.randn_like(plain[2]), torch.randn_like(plain[7]), saved)
    torch.library.opcheck(torch.ops.flash_kda_train.chunk_kda_bwd.default, bwd)


def test_fake_outputs_have_the_real_strides():
    """torch.compile plans with the fake implementations: their outputs must have the real ops'
    shapes and strides, also for strided inputs (inductor asserts them: a transposed q failed)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = make_inputs(B=2, T=40, H=2, K=8, V=8, gate_in_kernel=True, requires_grad=False)
    q = x["q"].transpose(1, 2).contiguous().transpose(1, 2)  # [B, T, H, K] with T innermost but one
    h0 = x["initial_state"].transpose(-1, -2).contiguous().transpose(-1, -2)
    assert not q.is_contiguous() and not h0.is_contiguous()
    fwd = op_args(x, chunk_size=32, l2norm=True, gate=True, q=q, initial_state=h0)
    o, ht, saved = torch.ops.flash_kda_train.chunk_kda_fwd(*fwd)
    bwd = bwd_op_args(fwd, torch.randn_like(o), torch.randn_like(ht), saved)
    real = [o, ht] + list(torch.ops.flash_kda_train.chunk_kda_bwd(*bwd))
    with FakeTensorMode() as mode:
        fake_of = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in bwd]
        fake_o, fake_ht, _ = torch.ops.flash_kda_train.chunk_kda_fwd(*fake_of[:10], *fwd[10:])
        fake = [fake_o, fake_ht] + list(torch.ops.flash_kda_train.chunk_kda_bwd(*fake_of))
    for i, (r, f) in enumerate(zip(real, fake)):
        assert (r.shape, r.stride(), r.dtype) == (f.shape, f.stride(), f.dtype), i


def test_options_that_would_run_something_else_are_refused():
    """Calls that FLA would run differently, or a replay would compute wrongly, raise naming the
    argument instead of computing something else."""
    x = make_inputs(B=1, T=100, requires_grad=False, state=False)
    cu = torch.tensor([0, 37, 100])
    with pytest.raises(ValueError, match="use_graph: not supported with cu_seqlens"):
        fkt.chunk_kda(*args(x), cu_seqlens=cu, use_graph=True)
    fkt.chunk_kda(*args(x), use_graph=True)  # dense: nothing to replay differently
    with pytest.raises(ValueError, match="cu_seqlens_cpu: given without cu_seqlens"):
        fkt.chunk_kda(*args(x), cu_seqlens_cpu=cu)
    with pytest.raises(ValueError, match="chunk_size: expected an integer"):
        fkt.chunk_kda(*args(x), chunk_size=64.9)
    with pytest.raises(ValueError, match="q: expected a CPU or CUDA tensor, got one on meta"):
        fkt.chunk_kda(x["q"].to("meta"), *args(x)[1:])
    with pytest.raises(ValueError, match=r"chunk_size: expected an integer \(32 or 64\), got 4294967328"):
        fkt.chunk_kda(*args(x), chunk_size=2**32 + 32)  # would wrap to 32 in the 32-bit option
    with pytest.raises(ValueError, match="q: expected bfloat16, float16, float32 or float64, got an unsupported"):
        fkt.chunk_kda(x["q"].to(torch.complex64), *args(x)[1:])
    with pytest.raises(ValueError, match="cu_seqlens: expected int32 or int64, got an unsupported dtype"):
        fkt.chunk_kda(*args(x), cu_seqlens=cu.to(torch.uint32))
    with pytest.raises(ValueError, match="q: expected a head dimension K >= 1, got K = 0"):
        fkt.chunk_kda(*(t[..., :0] if t.dim() == 4 and n != "v" else t for n, t in zip("qkvgb", args(x))))
    cpu_copy = torch.tensor([0, 30, 100])
    with pytest.raises(ValueError, match=r"cu_seqlens: expected the offsets of its host copy cu_seqlens_cpu, "
                                         r"got cu_seqlens\[1\] = 37 where cu_seqlens_cpu\[1\] = 30"):
        fkt.chunk_kda(*args(x), cu_seqlens=cu, cu_seqlens_cpu=cpu_copy)
    with pytest.raises(ValueError, match="cu_seqlens: expected int32 or int64, got float32"):
        fkt.chunk_kda(*args(x), cu_seqlens=cu.float(), cu_seqlens_cpu=cu)
    with pytest.raises(ValueError, match=r"cu_seqlens: expected a 1-D tensor of N \+ 1 = 3 offsets"):
        fkt.chunk_kda(*args(x), cu_seqlens=torch.tensor([0, 100]), cu_seqlens_cpu=cu)
    for wrong in (dict(cu_seqlens=cu.float()), dict(cu_seqlens=cu, cu_seqlens_cpu=cpu_copy)):  # whole-call checks
        with pytest.raises(ValueError, match="cu_seqlens"):
            fkt.chunk_kda(*args(x), segment_size=64, **wrong)
    with pytest.raises(ValueError, match=r"initial_state: expected one state per sequence, N = 2"):
        fkt.chunk_kda(*args(x), cu_seqlens=cu, segment_size=64, initial_state=torch.zeros(5, 2, 16, 16))


def test_paired_backward_refuses_inputs_changed_in_place():
    """The paired API keeps the inputs by reference: one changed in place between forward and
    backward would give the gradients of other inputs; backward raises naming it."""
    x = make_inputs(gate_in_kernel=True, requires_grad=False)
    o, _, context = fkt.forward(*args(x), use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"])
    fkt.backward(context, torch.ones_like(o))
    with pytest.raises(ValueError, match="dht: given, but the forward ran with output_final_state=False"):
        fkt.backward(context, torch.ones_like(o), torch.zeros_like(x["initial_state"]))
    x["A_log"].add_(1.0)
    with pytest.raises(RuntimeError, match="backward: A_log was modified in place after forward"):
        fkt.backward(context, torch.ones_like(o))


def test_no_tokens():
    """T = 0 (every sequence empty): o is empty, the final state is the initial state and its
    gradient passes through to dh0 (empty tensors have no layout: no contiguity error)."""
    x = make_inputs(B=2, T=0)
    o, ht = fkt.chunk_kda(*args(x), initial_state=x["initial_state"], output_final_state=True)
    assert o.shape == x["v"].shape and torch.equal(ht, x["initial_state"])
    dht = torch.randn_like(ht)
    torch.autograd.backward([o, ht], [torch.zeros_like(o), dht])
    assert torch.equal(x["initial_state"].grad, dht) and x["q"].grad.shape == x["q"].shape


def test_second_order_gradients_raise():
    """The backward is not differentiable: create_graph=True and a gradient of a gradient raise
    instead of silently leaving out the op's second-order terms."""
    x = make_inputs(requires_grad=True, state=False)
    o, _ = fkt.chunk_kda(*args(x))
    (dv,) = torch.autograd.grad(o.square().sum(), [x["v"]], create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        dv.sum().backward()


class TinyKDA(torch.nn.Module):
    """Projections around chunk_kda with the in-kernel gate: what a model layer does."""

    def __init__(self, hidden=32, heads=2, head_dim=16, disable_recompute=False, segment_size=None):
        super().__init__()
        self.heads, self.head_dim, self.disable_recompute = heads, head_dim, disable_recompute
        self.segment_size = segment_size
        self.proj = torch.nn.Linear(hidden, heads * (4 * head_dim + 1))
        self.A_log = torch.nn.Parameter(torch.zeros(heads))
        self.dt_bias = torch.nn.Parameter(torch.zeros(heads * head_dim))
        self.out = torch.nn.Linear(heads * head_dim, hidden)

    def forward(self, x):
        B, T, _ = x.shape
        H, D = self.heads, self.head_dim
        q, k, v, g, beta = self.proj(x).split([H * D, H * D, H * D, H * D, H], dim=-1)
        shape = (B, T, H, D)
        o, _ = fkt.chunk_kda(q.reshape(shape), k.reshape(shape), v.reshape(shape), g.reshape(shape), beta,
                             use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                             A_log=self.A_log, dt_bias=self.dt_bias, disable_recompute=self.disable_recompute,
                             segment_size=self.segment_size)
        return self.out(o.reshape(B, T, H * D))


# CPU: the AOT-autograd path without code generation; GPU: the default inductor backend. With
# disable_recompute the forward op also returns the workspace the backward reads (CUDA), whose size
# the fake implementation leaves data-dependent.
@pytest.mark.parametrize("disable_recompute,segment_size", [(False, None), (True, None), (False, 64)])
@pytest.mark.parametrize("device,backend", [
    ("cpu", "aot_eager"),
    pytest.param("cuda", "inductor", marks=needs_cuda),
])
def test_torch_compile_fullgraph_matches_eager(device, backend, disable_recompute, segment_size):
    torch.manual_seed(0)
    model = TinyKDA(disable_recompute=disable_recompute, segment_size=segment_size).to(device)
    x = torch.randn(2, 70, 32, device=device)
    eager_out = model(x)
    eager_grads = torch.autograd.grad(eager_out.square().sum(), list(model.parameters()))
    compiled = torch.compile(model, fullgraph=True, backend=backend)  # fullgraph: a graph break is an error
    out = compiled(x)
    grads = torch.autograd.grad(out.square().sum(), list(model.parameters()))
    torch.testing.assert_close(out, eager_out)
    for a, b in zip(grads, eager_grads):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_disable_recompute_gives_the_same_gradients(device):
    """With disable_recompute the CUDA backward reads the forward's intermediates instead of
    recomputing them (the same kernels wrote them): every gradient is bitwise the same. The CPU
    backend always recomputes."""
    x = make_inputs(B=2, T=130, H=2, HV=4, K=32, V=48, gate_in_kernel=True, requires_grad=False)
    leaves = {n: (t.to(device) if isinstance(t, torch.Tensor) else t) for n, t in x.items()}
    recomputed, kept = (run_with_grads(x, device, use_gate_in_kernel=True, disable_recompute=keep)
                        for keep in (False, True))
    assert recomputed.keys() == kept.keys()
    for name, value in recomputed.items():
        assert torch.equal(value, kept[name]), name
    o, final_state, context = fkt.forward(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
                                          use_gate_in_kernel=True, A_log=leaves["A_log"], dt_bias=leaves["dt_bias"],
                                          disable_recompute=True)
    assert (context.saved is not None) == (device == "cuda")
    grads = fkt.backward(context, torch.ones_like(o))
    assert torch.isfinite(grads.dq).all()
    if device == "cuda":
        with pytest.raises(ValueError, match="pass the forward's saved workspace"):
            fkt.backward(dataclasses.replace(context, saved=None), torch.ones_like(o))


def test_a_kept_workspace_serves_one_backward(monkeypatch):
    """With disable_recompute on CUDA the backward writes gradients over the intermediates it read
    from the forward's kept workspace, so the Python layer refuses a second backward on it (the C
    library cannot tell). The CPU backend keeps nothing: here the planner's answer is stubbed to
    "kept" and the C forward and backward to no-ops (test_cuda_backward runs the real case)."""
    from flash_kda_train import _abi, _lib

    planned = _abi.Call.sizes

    def kept(call):
        sizes = planned(call)
        sizes.backward_reads_forward_workspace = 1
        sizes.forward_workspace_bytes = sizes.backward_workspace_bytes = 64
        return sizes

    memory = torch.empty(64, dtype=torch.uint8)  # every workspace in the same memory, as after a free
    monkeypatch.setattr(_abi.Call, "sizes", kept)
    monkeypatch.setattr(_abi.Call, "buffer", lambda call, nbytes: memory)
    monkeypatch.setattr(_lib.lib, "fkt_forward", lambda *a: 0)
    monkeypatch.setattr(_lib.lib, "fkt_backward", lambda *a: 0)
    x = make_inputs(requires_grad=False)
    o, _, context = fkt.forward(*args(x))
    assert context.saved is memory
    fkt.backward(context, torch.ones_like(o))
    with pytest.raises(RuntimeError, match="a backward already ran on this forward's kept workspace"):
        fkt.backward(context, torch.ones_like(o))
    o, _, later = fkt.forward(*args(x))  # a new forward's workspace, in that memory, serves its backward
    fkt.backward(later, torch.ones_like(o))
    with pytest.raises(RuntimeError, match="run one backward per forward, or use disable_recompute=False"):
        fkt.backward(later, torch.ones_like(o))


def run_with_grads(x, device, **kw):
    """o, the final state and every input's gradient of one chunk_kda call on `device`."""
    ins = {n: t.detach().to(device).requires_grad_() for n, t in x.items()
           if isinstance(t, torch.Tensor) and t.is_floating_point()}
    o, ht = fkt.chunk_kda(ins["q"], ins["k"], ins["v"], ins["g"], ins["beta"], initial_state=ins.get("initial_state"),
                          output_final_state=True, A_log=ins.get("A_log"), dt_bias=ins.get("dt_bias"), **kw)
    torch.manual_seed(1)
    torch.autograd.backward([o, ht], [torch.randn_like(o), torch.randn_like(ht)])
    return {"o": o, "ht": ht, **{"d" + n: t.grad for n, t in ins.items()}}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
@pytest.mark.parametrize("B,T,segment,cu,state,opts", [
    (1, 300, 64, None, True, dict()),                                 # five segments, a short last one
    (2, 200, 128, None, True, dict(use_gate_in_kernel=True, safe_gate=True, lower_bound=-5.0)),  # strided
    (1, 150, 32, None, False, dict(chunk_size=32, use_qk_l2norm_in_kernel=True, state_v_first=True)),
    # Packed: a sequence over three segments, cuts inside and at sequence starts, empty sequences at
    # a cut and at the end, with and without initial states.
    (1, 400, 128, [0, 30, 30, 290, 310, 384, 400, 400], True, dict()),
    (1, 400, 64, [0, 100, 100, 300, 400], False, dict(use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True)),
    (1, 260, 64, [0, 64, 130, 260], True, dict(chunk_size=32, state_v_first=True)),
])
def test_segments_give_the_result_of_one_call(device, B, T, segment, cu, state, opts):
    """segment_size runs the op segment by segment with the state of a cut sequence carried (fp32)
    into the next segment: the chunks and the recurrence are those of one call, so every output
    and gradient matches it to fp32 rounding of the reductions across segments (dA_log, ddt_bias
    sum the segments' parts)."""
    torch.manual_seed(0)
    gate = opts.get("use_gate_in_kernel", False)
    x = make_inputs(B=B, T=T, H=2, HV=4, K=32, V=16, gate_in_kernel=gate, cu_seqlens=cu, state=state,
                    beta_logits=opts.get("use_beta_sigmoid_in_kernel", False),
                    state_v_first=opts.get("state_v_first", False), requires_grad=False)
    if cu is not None:
        opts = dict(opts, cu_seqlens=x["cu_seqlens"].to(device))
    one = run_with_grads(x, device, **opts)
    segmented = run_with_grads(x, device, segment_size=segment, **opts)
    assert one.keys() == segmented.keys()
    for name, ref in one.items():
        assert segmented[name].shape == ref.shape and segmented[name].dtype == ref.dtype, name
        assert rel_rms(segmented[name].cpu(), ref.cpu()) < 1e-6, (name, rel_rms(segmented[name].cpu(), ref.cpu()))


def test_segment_size_refusals():
    x = make_inputs(B=1, T=100, cu_seqlens=[0, 40, 100], requires_grad=False)
    for bad in (0, -64, 100, 64.0, True):
        with pytest.raises(ValueError, match=r"segment_size: expected a positive multiple of the chunk size 64 "):
            fkt.chunk_kda(*args(x), segment_size=bad)
    with torch.inference_mode(), pytest.raises(ValueError, match="segment_size: not with return_intermediate_states"):
        fkt.chunk_kda(*args(x), return_intermediate_states=True, segment_size=64)
    o, _ = fkt.chunk_kda(*args(x), segment_size=128)  # one segment: the plain call
    assert torch.equal(o, fkt.chunk_kda(*args(x))[0])
    # Offsets the op refuses reach it whole, for its own message.
    with pytest.raises(ValueError, match="cu_seqlens"):
        fkt.chunk_kda(*args(x), cu_seqlens=torch.tensor([0, 70, 40, 100]), segment_size=64)


def test_segment_plan_cuts_on_chunk_boundaries():
    from flash_kda_train import segments
    assert segments.plan([0, 300], 128, 64) == [(0, 128), (128, 256), (256, 300)]
    # 30 + 64 k inside the sequence that starts at 30; a limit at or past a sequence start cuts there.
    assert segments.plan([0, 30, 30, 290, 310, 384, 400, 400], 128, 64) == [(0, 94), (94, 222), (222, 310),
                                                                            (310, 400)]
    assert segments.plan([0, 0, 64, 64], 64, 64) == [(0, 64)]
