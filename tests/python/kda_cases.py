"""Input recipes shared by the Python tests (kda-math.md section 7 style data, small shapes)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import flash_kda_train as fkt

# Marks a test, module or parameter that needs a CUDA GPU and the library's CUDA backend.
needs_cuda = pytest.mark.skipif(not (torch.cuda.is_available() and fkt.has_cuda()),
                                reason="needs a CUDA GPU and a library built with the CUDA backend")

# K = V = 128 with chunks of 64 (the wgmma state passes) over nine sequences, most of them ending
# inside a chunk, and enough sequences x heads for more blocks than SMs (288 here).
WIDE = dict(K=128, V=128, B=1, T=400, H=8, HV=16, cu_seqlens=[0, 1, 64, 65, 130, 200, 257, 300, 333, 400])


def make_inputs(B=2, T=100, H=2, HV=None, K=16, V=16, dtype=torch.float32, gate_in_kernel=False,
                beta_logits=False, cu_seqlens=None, state=True, state_v_first=False, requires_grad=True,
                gate_scale=1.0):
    HV = HV or H
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    x = dict(
        q=torch.randn(B, T, H, K).to(dtype),
        k=F.normalize(torch.randn(B, T, H, K), dim=-1).to(dtype),
        v=torch.randn(B, T, HV, V).to(dtype),
        g=(torch.randn(B, T, HV, K) if gate_in_kernel
           else gate_scale * F.logsigmoid(torch.randn(B, T, HV, K))).to(dtype),
        beta=(torch.randn(B, T, HV) if beta_logits else torch.rand(B, T, HV)).to(dtype),
        initial_state=(torch.randn(N, HV, V, K) if state_v_first else torch.randn(N, HV, K, V)).to(state_dtype)
        if state else None,
        A_log=(torch.randn(HV) * 0.5).to(state_dtype) if gate_in_kernel else None,
        dt_bias=torch.randn(HV * K).to(state_dtype) if gate_in_kernel else None,
    )
    if requires_grad:
        for t in x.values():
            if t is not None:
                t.requires_grad_(True)
    if cu_seqlens is not None:
        x["cu_seqlens"] = torch.tensor(cu_seqlens, dtype=torch.int64)
    return x


def rel_rms(x, ref):
    x, ref = x.detach().double(), ref.detach().double()
    return float((x - ref).norm() / ref.norm().clamp_min(1e-300))


LEAVES = [("dq", "q"), ("dk", "k"), ("dv", "v"), ("dg", "g"), ("dbeta", "beta"), ("dA_log", "A_log"),
          ("ddt_bias", "dt_bias"), ("dh0", "initial_state")]


def capture_graph(step):
    """(graph, what step returned during capture): step warmed up once on a side stream (outside
    capture, as torch.cuda.graph asks), then captured in a CUDA graph on the current device."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    return graph, captured


def launches(fn, name):
    """How many kernels whose name holds `name` fn launches (torch.profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages() if name in e.key)
