"""flash_kda_train as a backend of FLA's chunk_kda (``import flash_kda_train.fla``).

On a GPU: FLA's public chunk_kda, over a grid like FLA's own KDA tests, runs our kernels (a spy on
the C entry points proves it) and meets FLA's thresholds against the fp64 gold. Everywhere: the
registration, the verifier's reasons and the opt-out switch.
"""

import logging
from inspect import unwrap

import pytest
import torch
import torch.nn.functional as F

fla_chunk = pytest.importorskip("fla.ops.kda.chunk", reason="fla-core is not installed")
fla_backends = pytest.importorskip("fla.backends")

import flash_kda_train as fkt  # noqa: E402
from flash_kda_train import _lib  # noqa: E402
from flash_kda_train import fla as plugin  # noqa: E402
from kda_cases import needs_cuda, rel_rms  # noqa: E402



def registry():
    return fla_backends._function_registries[unwrap(fla_chunk.chunk_kda)]


def test_registered_in_fla_registry():
    backend = registry()._backends["flash_kda_train"]
    assert isinstance(backend, plugin.FlashKDATrainBackend) and backend.priority == 4


def test_verifier_declines_with_reason_logged_once(caplog):
    q = torch.rand(1, 8, 1, 16)
    args = (q, q, torch.rand(1, 8, 1, 16), torch.rand(1, 8, 1, 16), torch.rand(1, 8, 1))
    backend = registry()._backends["flash_kda_train"]
    plugin._declined.clear()
    with caplog.at_level(logging.INFO, logger="flash_kda_train.fla"):
        for _ in range(3):
            accepted, reason = backend.verify("chunk_kda", *args)
            assert not accepted and ("CUDA" in reason)
    assert sum("declines chunk_kda" in r.getMessage() for r in caplog.records) == 1


def test_opt_out_switch(monkeypatch):
    backend = registry()._backends["flash_kda_train"]
    monkeypatch.setenv("FLA_FLASH_KDA_TRAIN", "0")
    assert not backend.is_enabled()
    monkeypatch.setenv("FLA_FLASH_KDA_TRAIN", "1")
    assert backend.is_enabled()


# (B, T, H, HV, D, scale, l2norm in op, gate in op, safe, mask_p, dtype, chunk, disable_recompute, cu_seqlens)
GRID = [
    (1, 63, 1, 1, 64, 1.0, False, False, True, 0.0, torch.float16, 64, False, None),
    (2, 500, 3, 3, 60, 1.0, False, False, True, 0.0, torch.float16, 64, True, None),
    (2, 1000, 3, 3, 64, 0.1, False, False, False, 0.5, torch.float16, 64, True, None),
    (4, 1024, 4, 4, 128, 0.1, True, False, True, 0.0, torch.float16, 64, False, None),
    (2, 1500, 4, 4, 128, 0.1, False, True, False, 0.0, torch.float16, 64, True, None),
    (2, 1024, 2, 4, 64, 0.1, False, False, False, 0.0, torch.float16, 64, False, None),
    (2, 1024, 4, 8, 128, 0.1, True, True, False, 0.0, torch.float16, 64, False, None),
    (2, 160, 2, 4, 64, 0.1, False, True, True, 0.0, torch.bfloat16, 32, True, None),
    (1, 1000, 4, 4, 128, 0.1, False, False, False, 0.5, torch.float16, 64, False, [0, 256, 500, 1000]),
    (1, 2000, 4, 4, 100, 0.1, False, True, False, 0.0, torch.float16, 64, False, [0, 15, 100, 300, 1200, 2000]),
]
# FLA's thresholds for relative RMS error (kda-math.md section 7.3), as hard limits.
THRESHOLDS = dict(o=0.005, final_state=0.005, dq=0.008, dk=0.008, dv=0.008, dg=0.02, dbeta=0.02, dh0=0.008,
                  dA_log=0.003, ddt_bias=0.008)


@needs_cuda
@pytest.mark.parametrize("case", GRID, ids=[f"case{i}" for i in range(len(GRID))])
def test_fla_chunk_kda_runs_ours_and_matches_gold(case, monkeypatch):
    B, T, H, HV, D, scale, l2, gate, safe, mask_p, dtype, chunk, recompute_off, cu = case
    calls = {"fkt_forward": 0, "fkt_backward": 0}
    for name in calls:
        real = getattr(_lib.lib, name)

        def spy(*args, _real=real, _name=name):
            calls[_name] += 1
            return _real(*args)

        monkeypatch.setattr(_lib.lib, name, spy)
    torch.manual_seed(0)
    N = B if cu is None else len(cu) - 1
    q, k = torch.rand(B, T, H, D), torch.rand(B, T, H, D)
    if not l2:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    if gate:
        g = torch.randn(B, T, HV, D)
        extra = dict(A_log=torch.randn(HV), dt_bias=torch.randn(HV * D), lower_bound=-5.0 if safe else None)
    else:
        g = F.logsigmoid(torch.randn(B, T, HV, D))
        g = g.masked_fill(torch.rand_like(g) < mask_p, 0.0)
        g = g.clamp(-5, 0) if safe else g
        extra = {}
    x = dict(q=q.to(dtype), k=k.to(dtype), v=torch.rand(B, T, HV, D).to(dtype), g=g.to(dtype),
             beta=torch.sigmoid(torch.randn(B, T, HV)).to(dtype), initial_state=torch.randn(N, HV, D, D))
    x.update({n: t for n, t in extra.items() if isinstance(t, torch.Tensor)})
    dev = {n: t.cuda().requires_grad_(True) for n, t in x.items()}
    cu_t = torch.tensor(cu, dtype=torch.int64) if cu is not None else None
    kw = dict(scale=scale, output_final_state=True, use_qk_l2norm_in_kernel=l2, use_gate_in_kernel=gate,
              safe_gate=safe, lower_bound=extra.get("lower_bound"), disable_recompute=recompute_off,
              chunk_size=chunk)
    o, ht = fla_chunk.chunk_kda(dev["q"], dev["k"], dev["v"], dev["g"], dev["beta"], initial_state=dev["initial_state"],
                                cu_seqlens=cu_t.cuda() if cu_t is not None else None, cu_seqlens_cpu=cu_t,
                                A_log=dev.get("A_log"), dt_bias=dev.get("dt_bias"), **kw)
    do, dht = torch.randn_like(o), torch.randn_like(ht)
    torch.autograd.backward([o, ht], [do, dht])
    assert calls == {"fkt_forward": 1, "fkt_backward": 1}, calls  # our kernels ran, FLA's did not

    gold_kw = {n: v for n, v in kw.items() if n != "disable_recompute"}  # a memory policy, not math
    gold_o, gold_ht, gold = fkt.reference.gold(x["q"], x["k"], x["v"], x["g"], x["beta"], do=do.cpu(), dht=dht.cpu(),
                                               initial_state=x["initial_state"], A_log=x.get("A_log"),
                                               dt_bias=x.get("dt_bias"), cu_seqlens=cu_t, **gold_kw)
    errors = {"o": rel_rms(o.cpu(), gold_o), "final_state": rel_rms(ht.cpu(), gold_ht)}
    for name, leaf in [("dq", "q"), ("dk", "k"), ("dv", "v"), ("dg", "g"), ("dbeta", "beta"), ("dh0", "initial_state"),
                       ("dA_log", "A_log"), ("ddt_bias", "dt_bias")]:
        if leaf in dev:
            errors[name] = rel_rms(dev[leaf].grad.cpu(), getattr(gold, name))
    for name, err in errors.items():
        assert err < THRESHOLDS[name], (name, err)
