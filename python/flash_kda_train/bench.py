"""The benchmark of ``shared/docs/benchmarks.md``: ours and FLA's ``chunk_kda`` side by side.

``python -m flash_kda_train bench --help`` (or ``python -m flash_kda_train.bench``) lists the
options. Protocol: the same inputs in the same process for both implementations; CUDA events
around the whole operator call (forward, and forward+backward through autograd), after the warm-up
calls, median of the repetitions, a 512 MiB buffer zeroed before each repetition to flush L2;
peak extra memory (``torch.cuda.max_memory_allocated`` above the inputs) of one forward and of one
forward+backward; the achieved bandwidth (the minimum traffic of the call over its time) next to the
device's copy rate measured in the same run; optionally the relative RMS error of every output and
gradient against the fp64 gold and a per-kernel profile. Results go to a JSON file (the artifact),
with a markdown table and a PNG plot generated from it (``--report FILE.json`` regenerates both).

Speedup is FLA's time divided by ours: above 1 means ours is faster.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import fnmatch
import json
import math
import os
import pathlib
import platform
import re
import statistics
import subprocess
import sys
import time
import warnings
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

SCHEMA = 1
ERROR_TENSORS = ("o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias", "dh0")


# --------------------------------------------------------------------------------------------
# Shapes and configurations


@dataclasses.dataclass(frozen=True)
class Shape:
    """One benchmark shape; ``seqlens`` set means packed sequences (B = 1, cu_seqlens)."""

    name: str
    B: int
    T: int
    H: int
    HV: int
    seqlens: Optional[Tuple[int, ...]] = None
    why: str = ""

    @property
    def num_sequences(self) -> int:
        return len(self.seqlens) if self.seqlens else self.B

    @property
    def token_heads(self) -> int:
        return self.B * self.T * self.HV

    def scaled(self, scale: float) -> "Shape":
        """T (every packed length) times ``scale``, at least 1 token."""
        if scale == 1.0:
            return self
        if self.seqlens:
            lens = tuple(max(1, round(n * scale)) for n in self.seqlens)
            return dataclasses.replace(self, T=sum(lens), seqlens=lens)
        return dataclasses.replace(self, T=max(1, round(self.T * scale)))

    def describe(self) -> str:
        heads = f"H={self.H}" + (f" HV={self.HV}" if self.HV != self.H else "")
        if self.seqlens:
            return f"packed {'/'.join(map(str, self.seqlens))} (T={self.T}) {heads}"
        return f"B={self.B} T={self.T} {heads}"


def _varlen(name: str, lens: Sequence[int], H: int, HV: Optional[int] = None, why: str = "") -> Shape:
    return Shape(name, 1, sum(lens), H, HV or H, tuple(lens), why)


# The portfolio of benchmarks.md, in its order.
PORTFOLIO: List[Shape] = [
    Shape("B1_T8192_H96", 1, 8192, 96, 96, why="Kimi-Linear-size heads, one long sequence"),
    _varlen("varlen1024x8_H96", [1024] * 8, 96, why="packed training batch"),
    _varlen("varlen6_H96", [1300, 547, 2048, 963, 271, 3063], 96, why="ragged packing"),
    Shape("B2_T16384_H16", 2, 16384, 16, 16, why="TP-sharded heads, long sequences: few (seq, head) pairs"),
    Shape("B4_T2048_H16", 4, 2048, 16, 16, why="small step: launch overhead shows"),
    Shape("B4_T4096_H64", 4, 4096, 64, 64, why="GLM-style head count"),
    Shape("B1_T8192_H64", 1, 8192, 64, 64),
    Shape("B8_T4096_H32", 8, 4096, 32, 32),
    Shape("B1_T32768_H32", 1, 32768, 32, 32, why="long context"),
    Shape("gva_B2_T8192_H16_HV64", 2, 8192, 16, 64, why="grouped value heads"),
]

# The shapes of FLA's precision table in benchmarks.md (not in the default selection).
ACCURACY_SHAPES: List[Shape] = [
    Shape("acc_B1_T2048_H16", 1, 2048, 16, 16, why="FLA precision table row 1"),
    _varlen("acc_varlen_300_17_1000_64_H96", [300, 17, 1000, 64], 96, why="FLA precision table row 2"),
    Shape("acc_gva_B1_T1024_H16_HV64", 1, 1024, 16, 64, why="FLA precision table row 3"),
]

REGISTRY: Dict[str, Shape] = {s.name: s for s in PORTFOLIO + ACCURACY_SHAPES}

# FLA's relative RMS errors on H200 (benchmarks.md), the target for ours.
FLA_REFERENCE_ERRORS = {
    "acc_B1_T2048_H16": dict(o=3.5e-3, ht=2.5e-3, dq=3.1e-3, dk=3.3e-3, dv=3.0e-3, dg=4.0e-3, dbeta=3.4e-3,
                             dA_log=3.3e-3, ddt_bias=8.8e-3, dh0=1.5e-3),
    "acc_varlen_300_17_1000_64_H96": dict(o=3.5e-3, ht=2.6e-3, dq=3.1e-3, dk=3.4e-3, dv=3.0e-3, dg=3.9e-3,
                                          dbeta=3.0e-3, dA_log=4.0e-3, ddt_bias=6.3e-3, dh0=0.7e-3),
    "acc_gva_B1_T1024_H16_HV64": dict(o=3.5e-3, ht=2.5e-3, dq=3.1e-3, dk=3.3e-3, dv=3.0e-3, dg=4.1e-3,
                                      dbeta=2.8e-3, dA_log=3.9e-3, ddt_bias=8.6e-3, dh0=1.4e-3),
}

_DENSE = re.compile(r"^(?:gva_)?B(\d+)_T(\d+)_H(\d+)(?:_HV(\d+))?$")
_PACKED = re.compile(r"^varlen(\d+)x(\d+)_H(\d+)(?:_HV(\d+))?$")


def parse_shape(name: str) -> Optional[Shape]:
    """A shape outside the registry, from its name: ``B2_T100_H4``, ``B1_T64_H2_HV4``, ``varlen100x3_H4``."""
    m = _DENSE.match(name)
    if m:
        B, T, H, HV = (int(x) if x else None for x in m.groups())
        return Shape(name, B, T, H, HV or H)
    m = _PACKED.match(name)
    if m:
        n, count, H, HV = (int(x) if x else None for x in m.groups())
        return _varlen(name, [n] * count, H, HV)
    return None


def select_shapes(spec: Optional[str]) -> List[Shape]:
    """Comma-separated names or globs over the registry; unknown names are parsed as ad-hoc shapes."""
    if not spec:
        return list(PORTFOLIO)
    chosen: List[Shape] = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if item in ("portfolio", "all"):
            matches = list(PORTFOLIO) if item == "portfolio" else list(REGISTRY.values())
        elif any(c in item for c in "*?["):
            matches = [s for n, s in REGISTRY.items() if fnmatch.fnmatchcase(n, item)]
            if not matches:
                raise SystemExit(f"--shapes: {item!r} matches no shape; known: {', '.join(REGISTRY)}")
        elif item in REGISTRY:
            matches = [REGISTRY[item]]
        else:
            parsed = parse_shape(item)
            if parsed is None:
                raise SystemExit(f"--shapes: unknown shape {item!r}; known: {', '.join(REGISTRY)} "
                                 "(or B<b>_T<t>_H<h>[_HV<hv>], varlen<len>x<n>_H<h>[_HV<hv>])")
            matches = [parsed]
        chosen.extend(s for s in matches if s not in chosen)
    return chosen


@dataclasses.dataclass(frozen=True)
class Config:
    """One workload configuration (the options given to both implementations and the input recipe)."""

    name: str
    description: str
    use_gate_in_kernel: bool = True
    safe_gate: bool = True
    lower_bound: Optional[float] = -5.0
    use_qk_l2norm_in_kernel: bool = False
    use_beta_sigmoid_in_kernel: bool = False

    def options(self) -> dict:
        return dict(use_gate_in_kernel=self.use_gate_in_kernel, safe_gate=self.safe_gate,
                    lower_bound=self.lower_bound, use_qk_l2norm_in_kernel=self.use_qk_l2norm_in_kernel,
                    use_beta_sigmoid_in_kernel=self.use_beta_sigmoid_in_kernel, output_final_state=True)


CONFIGS: Dict[str, Config] = {c.name: c for c in [
    Config("default", "bounded-sigmoid gate in kernel (safe_gate, lower_bound=-5), q/k pre-normalised, "
                      "post-sigmoid beta"),
    Config("softplus_gate", "softplus gate in kernel (-exp(A_log)*softplus(g+dt_bias)), no safe_gate",
           safe_gate=False, lower_bound=None),
    Config("precomputed_g", "precomputed log-space gate g = logsigmoid(x), no A_log/dt_bias",
           use_gate_in_kernel=False, safe_gate=False, lower_bound=None),
    Config("l2norm_in_kernel", "default, with raw q/k and use_qk_l2norm_in_kernel=True",
           use_qk_l2norm_in_kernel=True),
    Config("raw_beta", "default, with beta logits and use_beta_sigmoid_in_kernel=True",
           use_beta_sigmoid_in_kernel=True),
]}
EXTRA_CONFIGS = [n for n in CONFIGS if n != "default"]


def make_inputs(shape: Shape, config: Config, device: torch.device, dtype: torch.dtype, dim: int, seed: int):
    """The workload of benchmarks.md: leaves (requires_grad) plus do, dht and the varlen offsets."""
    gen = torch.Generator(device=device).manual_seed(seed)
    B, T, H, HV, K, V, N = shape.B, shape.T, shape.H, shape.HV, dim, dim, shape.num_sequences

    def randn(*size, scale=1.0):
        return torch.randn(*size, generator=gen, device=device, dtype=torch.float32) * scale

    q, k = randn(B, T, H, K), randn(B, T, H, K)
    if not config.use_qk_l2norm_in_kernel:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    g = randn(B, T, HV, K)
    if not config.use_gate_in_kernel:
        g = F.logsigmoid(g)
    beta = randn(B, T, HV)
    if not config.use_beta_sigmoid_in_kernel:
        beta = torch.sigmoid(beta)
    x = dict(q=q.to(dtype), k=k.to(dtype), v=randn(B, T, HV, V).to(dtype), g=g.to(dtype), beta=beta.to(dtype))
    if config.use_gate_in_kernel:
        x["A_log"] = randn(HV, scale=0.5)
        x["dt_bias"] = randn(HV * K)
    x["initial_state"] = randn(N, HV, K, V)
    leaves = list(x)
    for name in leaves:
        x[name].requires_grad_(True)
    x["do"] = randn(B, T, HV, V).to(dtype)
    x["dht"] = randn(N, HV, K, V)
    if shape.seqlens:
        offsets = [0]
        for n in shape.seqlens:
            offsets.append(offsets[-1] + n)
        x["cu_seqlens_cpu"] = torch.tensor(offsets, dtype=torch.int64)
        x["cu_seqlens"] = x["cu_seqlens_cpu"].to(device)
    return x, leaves


def minimum_traffic_bytes(x: dict, leaves: List[str]) -> Dict[str, int]:
    """Bytes any implementation moves at least (benchmarks.md, "The physical floor", without the
    per-chunk states, which depend on the algorithm): the forward reads every input and writes o and
    the final state; the forward+backward reads the inputs twice (forward, backward), reads do and
    dht, and writes o, the final state and one gradient per input."""
    def nbytes(t: torch.Tensor) -> int:
        return t.numel() * t.element_size()
    inputs = sum(nbytes(x[n]) for n in leaves)  # the gradients have the same sizes
    outputs = nbytes(x["do"]) + nbytes(x["dht"])  # o and the final state have the sizes of do and dht
    return dict(fwd=inputs + outputs, fwd_bwd=2 * inputs + outputs + outputs + inputs)


# --------------------------------------------------------------------------------------------
# The two implementations


def _call_kwargs(x: dict, config: Config) -> dict:
    kw = dict(initial_state=x["initial_state"], **config.options())
    if config.use_gate_in_kernel:
        kw.update(A_log=x["A_log"], dt_bias=x["dt_bias"])
    if "cu_seqlens" in x:
        kw.update(cu_seqlens=x["cu_seqlens"], cu_seqlens_cpu=x["cu_seqlens_cpu"])
    return kw


def ours_fn(backend: str, extra: dict):
    """Our chunk_kda; `extra` holds the options FLA does not have (segment_size) or that only ours
    is asked for (disable_recompute)."""
    from . import chunk_kda

    def call(x, config):
        return chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], backend=backend, **_call_kwargs(x, config),
                         **extra)
    return call


def fla_fn():
    """FLA's chunk_kda, or the reason it cannot run here."""
    try:
        from fla.ops.kda import chunk_kda as fla_chunk_kda
    except Exception as e:  # ImportError, or an incompatible dependency failing at import
        return None, f"fla.ops.kda not importable: {type(e).__name__}: {e}"

    def call(x, config):
        return fla_chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], **_call_kwargs(x, config))
    return call, None


# --------------------------------------------------------------------------------------------
# Measurement


class Device:
    """Synchronisation, timing, memory and L2 flushing on one device."""

    def __init__(self, device: torch.device, flush_mib: int):
        self.device = device
        self.cuda = device.type == "cuda"
        self.flush = (torch.empty(flush_mib << 20, dtype=torch.uint8, device=device)
                      if self.cuda and flush_mib > 0 else None)

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def time_ms(self, run: Callable, reps: int, queue_first: Optional[Callable] = None) -> List[float]:
        """One time per repetition: L2 flushed and the GPU idle before each, then the whole call.
        ``queue_first`` (CUDA) enqueues work after the flush and before the start event, which then
        records when that work ends (``benchmarks/host_probe.py``: a sleep that hides the host)."""
        if not self.cuda:
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                out = run()
                times.append((time.perf_counter() - t0) * 1e3)
                del out
            return times
        events = []
        for _ in range(reps):
            if self.flush is not None:
                self.flush.zero_()
            torch.cuda.synchronize(self.device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if queue_first is not None:
                queue_first()
            start.record()
            out = run()
            end.record()
            del out
            events.append((start, end))
        torch.cuda.synchronize(self.device)
        return [s.elapsed_time(e) for s, e in events]

    def copy_rate_tbps(self, reps: int = 5) -> Optional[float]:
        """Device-to-device copy of the flush buffer (read + write bytes over the median time): the
        rate benchmarks.md quotes (about 4.3 TB/s on the H200). None without a flush buffer (off
        CUDA, or --flush-mib 0)."""
        if self.flush is None:
            return None
        dst = torch.empty_like(self.flush)
        dst.copy_(self.flush)
        times = self.time_ms(lambda: dst.copy_(self.flush), reps)
        del dst
        return 2 * self.flush.numel() / (statistics.median(times) * 1e-3) / 1e12

    def peak_extra_bytes(self, run: Callable) -> Optional[int]:
        """Peak allocated memory above what was allocated before ``run`` (None off CUDA)."""
        if not self.cuda:
            out = run()
            del out
            return None
        self.sync()
        base = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        out = run()
        self.sync()
        peak = torch.cuda.max_memory_allocated(self.device) - base
        del out
        return int(peak)


def rel_rms(x: Optional[torch.Tensor], gold: Optional[torch.Tensor]) -> Optional[float]:
    if x is None or gold is None:
        return None
    x, gold = x.detach().to("cpu", torch.float64), gold.detach().to("cpu", torch.float64)
    return float((x - gold).norm() / gold.norm().clamp_min(1e-300))


_GRAD_OF = {"q": "dq", "k": "dk", "v": "dv", "g": "dg", "beta": "dbeta", "A_log": "dA_log", "dt_bias": "ddt_bias",
            "initial_state": "dh0"}


def gold_outputs(x: dict, config: Config) -> Dict[str, torch.Tensor]:
    from . import reference
    kw = _call_kwargs(x, config)
    kw.pop("cu_seqlens_cpu", None)
    o, ht, grads = reference.gold(x["q"], x["k"], x["v"], x["g"], x["beta"], do=x["do"], dht=x["dht"], **kw)
    out = dict(o=o, ht=ht)
    out.update({name: getattr(grads, name) for name in _GRAD_OF.values() if getattr(grads, name) is not None})
    return out


def _unsupported(e: BaseException) -> dict:
    # The library raises ValueError (or NotImplementedError) naming what it does not support;
    # anything else (a crash, out of memory) is an error.
    kind = "unsupported" if isinstance(e, (ValueError, NotImplementedError, TypeError)) else "error"
    msg = str(e).strip().splitlines()
    return dict(status=kind, reason=f"{type(e).__name__}: {msg[0] if msg else ''}"[:500])


def _median(ts: Optional[List[float]]) -> Optional[float]:
    return statistics.median(ts) if ts else None


def profile_step(dev: Device, run: Callable, top: int) -> dict:
    """Kernel names and total GPU time per kernel for one call (CPU: operators by self CPU time)."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.cuda else [])
    dev.sync()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
        with profile(activities=activities) as prof:
            out = run()
            dev.sync()
    del out
    totals: Dict[str, List[float]] = {}
    if dev.cuda:
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                entry = totals.setdefault(e.name, [0.0, 0])
                entry[0] += e.time_range.elapsed_us()
                entry[1] += 1
        unit = "GPU kernel time"
    else:
        for e in prof.key_averages():
            if e.self_cpu_time_total > 0:
                totals[e.key] = [float(e.self_cpu_time_total), int(e.count)]
        unit = "self CPU time of operators"
    total_us = sum(v[0] for v in totals.values())
    rows = sorted(totals.items(), key=lambda kv: -kv[1][0])
    return dict(unit=unit, total_ms=total_us / 1e3, num_kernels=len(rows),
                kernels=[dict(name=n, ms=us / 1e3, calls=c, share=us / total_us if total_us else None)
                         for n, (us, c) in rows[:top]],
                other_ms=sum(v[0] for _, v in rows[top:]) / 1e3)


def measure(dev: Device, call, x: dict, leaves: List[str], config: Config, args,
            gold: Optional[Dict[str, torch.Tensor]]) -> dict:
    """Forward and forward+backward of one implementation on one input set."""
    res: dict = dict(status="ok", reason=None, fwd_ms=None, fwd_bwd_ms=None, fwd_times_ms=None,
                     fwd_bwd_times_ms=None, peak_extra_gb_fwd=None, peak_extra_gb_fwd_bwd=None,
                     first_call_s=None, errors=None, profiles=None)
    tensors = [x[n] for n in leaves]

    def fwd():
        return call(x, config)

    def step():
        o, ht = call(x, config)
        return o, ht, torch.autograd.grad([o, ht], tensors, [x["do"], x["dht"]])

    t0 = time.perf_counter()
    try:
        out = fwd()
        dev.sync()
    except Exception as e:  # noqa: BLE001 (recorded, the run goes on)
        res.update(_unsupported(e))
        return res
    del out
    bwd_ok = True
    try:
        out = step()
        dev.sync()
        del out
    except Exception as e:  # noqa: BLE001
        bwd_ok = False
        info = _unsupported(e)
        res.update(status="fwd_only", reason="backward: " + info["reason"])
    res["first_call_s"] = time.perf_counter() - t0  # includes autotuning on a first call
    for _ in range(args.warmup):
        out = step() if bwd_ok else fwd()
        del out
    dev.sync()

    res["peak_extra_gb_fwd"] = _gb(dev.peak_extra_bytes(fwd))
    if bwd_ok:
        res["peak_extra_gb_fwd_bwd"] = _gb(dev.peak_extra_bytes(step))

    if gold is not None:
        o, ht = fwd()
        errors = dict(o=rel_rms(o, gold["o"]), ht=rel_rms(ht, gold["ht"]))
        del o, ht
        if bwd_ok:
            _, _, grads = step()
            for name, grad in zip(leaves, grads):
                errors[_GRAD_OF[name]] = rel_rms(grad, gold.get(_GRAD_OF[name]))
            del grads
        res["errors"] = errors

    res["fwd_times_ms"] = dev.time_ms(fwd, args.reps)
    res["fwd_ms"] = _median(res["fwd_times_ms"])
    if bwd_ok:
        res["fwd_bwd_times_ms"] = dev.time_ms(step, args.reps)
        res["fwd_bwd_ms"] = _median(res["fwd_bwd_times_ms"])
    if args.profile:
        res["profiles"] = {"forward": profile_step(dev, fwd, args.profile_top)}
        if bwd_ok:
            res["profiles"]["forward+backward"] = profile_step(dev, step, args.profile_top)
    return res


def _gb(nbytes: Optional[int]) -> Optional[float]:
    return None if nbytes is None else nbytes / 1e9


def _rate(nbytes: int, ms: Optional[float]) -> Optional[float]:
    """TB/s of nbytes moved in ms."""
    return nbytes / (ms * 1e-3) / 1e12 if ms else None


def _ratio(fla: Optional[float], ours: Optional[float]) -> Optional[float]:
    return fla / ours if fla and ours else None


# --------------------------------------------------------------------------------------------
# Environment


def _git(*cmd) -> Optional[str]:
    root = pathlib.Path(__file__).resolve().parents[2]
    try:
        return subprocess.run(["git", *cmd], cwd=root, capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()
    except Exception:  # noqa: BLE001 (no git, or not a checkout: e.g. a copied tree on the GPU machine)
        return None


def git_info(override: Optional[str]) -> dict:
    if override:
        return dict(commit=override, dirty=None, source="given")
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return dict(commit=None, dirty=None, source="unavailable (no git checkout; pass --git-commit or "
                                                    "FKT_GIT_COMMIT)")
    status = _git("status", "--porcelain", "--untracked-files=no")
    return dict(commit=commit, dirty=bool(status), source="git")


def _version(module: str) -> Optional[str]:
    try:
        return getattr(__import__(module), "__version__", "unknown")
    except Exception:  # noqa: BLE001
        return None


def environment(device: torch.device) -> dict:
    from . import has_cuda, version
    info = dict(python=platform.python_version(), torch=torch.__version__, torch_cuda=torch.version.cuda,
                triton=_version("triton"), flash_kda_train=version(), flash_kda_train_cuda_backend=has_cuda(),
                host=platform.node())
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(device=p.name, device_capability=f"{p.major}.{p.minor}", device_sms=p.multi_processor_count,
                    device_memory_gb=p.total_memory / 1e9)
    else:
        info.update(device=f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                           f"{torch.get_num_threads()} torch threads)")
    return info


# --------------------------------------------------------------------------------------------
# Progress


class Progress:
    """tqdm when it is installed and stderr is a terminal; otherwise one printed bar per step."""

    def __init__(self, total: int):
        self.total, self.done, self.t0 = total, 0, time.perf_counter()
        self.bar = None
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, unit="row", dynamic_ncols=True)
            except ImportError:
                pass

    def step(self, label: str):
        if self.bar is not None:
            self.bar.set_description(label)
            return
        width = 24
        filled = width * self.done // max(1, self.total)
        print(f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
              f"{time.perf_counter() - self.t0:6.0f}s  {label}", file=sys.stderr, flush=True)

    def advance(self):
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)

    def close(self):
        if self.bar is not None:
            self.bar.close()
        else:
            print(f"[{'#' * 24}] {self.done}/{self.total} {time.perf_counter() - self.t0:6.0f}s  done",
                  file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Reports: markdown and PNG from the JSON


def _fmt(v, spec=".2f", none="–"):
    return none if v is None else format(v, spec)


def _status_cell(r: dict, key: str) -> str:
    v = r.get(key)
    if v is not None:
        return f"{v:.2f}"
    return {"unsupported": "unsupp.", "error": "error", "fwd_only": "unsupp.", "skipped": "–",
            "unavailable": "n/a"}.get(r.get("status"), "–")


def _speedup(v) -> str:
    return "–" if v is None else f"{v:.2f}x"


def _geomean(values: List[float]) -> Optional[float]:
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def render_markdown(data: dict) -> str:
    env, proto, git = data.get("environment", {}), data.get("protocol", {}), data.get("git", {})
    lines = [f"# chunk_kda benchmark: flash_kda_train vs FLA ({data.get('created', '')})", ""]
    commit = git.get("commit") or "unknown"
    dirty = " (uncommitted changes)" if git.get("dirty") else ""
    lines += [
        f"- commit `{commit}`{dirty}; device {env.get('device', '?')}; torch {env.get('torch')}, "
        f"triton {env.get('triton')}, fla {env.get('fla')}, flash_kda_train {env.get('flash_kda_train')}",
        f"- protocol: {proto.get('timer')}, {proto.get('warmup')} warm-ups, median of {proto.get('reps')} reps, "
        f"{proto.get('flush_mib')} MiB L2 flush; dtype {proto.get('dtype')}, K=V={proto.get('dim')}, "
        f"T scale {proto.get('scale')}; forward timed with autograd recording (a training forward)",
        "- speedup = FLA ms / ours ms (above 1: ours faster); peak = extra GB allocated above the inputs"
        + (f"; ours with {', '.join(f'{k}={v}' for k, v in proto['ours_options'].items())}"
           if proto.get("ours_options") else ""),
        "",
        "| shape | config | ours fwd ms | FLA fwd ms | fwd speedup | ours fwd+bwd ms | FLA fwd+bwd ms | "
        "fwd+bwd speedup | ours peak GB fwd / fwd+bwd | FLA peak GB fwd / fwd+bwd |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    results = data.get("results", [])
    reasons: Dict[str, str] = {}
    for r in results:
        ours, fla, ratio = r.get("ours", {}), r.get("fla", {}), r.get("speedup", {})
        for who, res in (("ours", ours), ("FLA", fla)):
            if res.get("reason"):
                reasons.setdefault(f"{who}: {res['reason']}", r["shape"])
        lines.append(
            f"| {r['shape']} | {r['config']} | {_status_cell(ours, 'fwd_ms')} | {_status_cell(fla, 'fwd_ms')} | "
            f"{_speedup(ratio.get('fwd'))} | {_status_cell(ours, 'fwd_bwd_ms')} | "
            f"{_status_cell(fla, 'fwd_bwd_ms')} | {_speedup(ratio.get('fwd_bwd'))} | "
            f"{_fmt(ours.get('peak_extra_gb_fwd'))} / {_fmt(ours.get('peak_extra_gb_fwd_bwd'))} | "
            f"{_fmt(fla.get('peak_extra_gb_fwd'))} / {_fmt(fla.get('peak_extra_gb_fwd_bwd'))} |")
    configs = list(dict.fromkeys(r["config"] for r in results))
    for c in configs:
        rows = [r for r in results if r["config"] == c]
        gf = _geomean([r.get("speedup", {}).get("fwd") for r in rows])
        gb = _geomean([r.get("speedup", {}).get("fwd_bwd") for r in rows])
        mf = min((r["speedup"]["fwd"] for r in rows if r.get("speedup", {}).get("fwd")), default=None)
        mb = min((r["speedup"]["fwd_bwd"] for r in rows if r.get("speedup", {}).get("fwd_bwd")), default=None)
        if gf is None and gb is None:
            continue
        lines.append(f"| **geomean** ({c}) | | | | **{_speedup(gf)}** (min {_speedup(mf)}) | | | "
                     f"**{_speedup(gb)}** (min {_speedup(mb)}) | | |")
    if reasons:
        lines += ["", "Not measured:", ""]
        lines += [f"- {reason} (first seen on {shape})" for reason, shape in reasons.items()]

    with_traffic = [r for r in results if r.get("min_traffic_gb")]
    if with_traffic:
        copy = env.get("copy_tbps")
        lines += ["", "## Achieved bandwidth", "",
                  "Minimum traffic (every input read, o, the final state and every gradient written; inputs read "
                  "twice in forward+backward) over the median time, next to the device's copy rate measured in "
                  f"this run: {_fmt(copy)} TB/s (read + write). The share of it is how close a call is to the "
                  "memory floor.", "",
                  "| shape | config | min traffic GB fwd / fwd+bwd | ours TB/s fwd / fwd+bwd | "
                  "FLA TB/s fwd / fwd+bwd | ours % of copy rate fwd / fwd+bwd |",
                  "|---|---|---:|---:|---:|---:|"]
        for r in with_traffic:
            t = r["min_traffic_gb"]
            ours_bw = (r.get("ours") or {}).get("achieved_tbps") or {}
            fla_bw = (r.get("fla") or {}).get("achieved_tbps") or {}
            share = {k: (100 * v / copy if v is not None and copy else None) for k, v in ours_bw.items()}
            lines.append(f"| {r['shape']} | {r['config']} | "
                         f"{_fmt(t.get('fwd'), '.3g')} / {_fmt(t.get('fwd_bwd'), '.3g')} | "
                         f"{_fmt(ours_bw.get('fwd'))} / {_fmt(ours_bw.get('fwd_bwd'))} | "
                         f"{_fmt(fla_bw.get('fwd'))} / {_fmt(fla_bw.get('fwd_bwd'))} | "
                         f"{_fmt(share.get('fwd'), '.1f')} / {_fmt(share.get('fwd_bwd'), '.1f')} |")

    with_err = [r for r in results if any((r.get(w) or {}).get("errors") for w in ("ours", "fla"))]
    if with_err:
        lines += ["", "## Relative RMS error against the fp64 gold", "",
                  "norm(x - gold) / norm(gold) over each whole tensor; gold = fp64 token recurrence on the same "
                  "rounded inputs. `FLA (docs)` is the table of benchmarks.md. `ours/FLA` is the worst ratio "
                  "over the tensors measured for both in this run (at or below 1: as precise as FLA).", "",
                  "| shape | config | impl | " + " | ".join(ERROR_TENSORS) + " | ours/FLA |",
                  "|---|---|---|" + "---:|" * len(ERROR_TENSORS) + "---:|"]
        for r in with_err:
            ours_e, fla_e = (r.get("ours") or {}).get("errors"), (r.get("fla") or {}).get("errors")
            rows = [("ours", ours_e), ("FLA", fla_e)]
            if r["shape"] in FLA_REFERENCE_ERRORS and r["config"] == "default" and data.get("protocol", {}).get(
                    "scale") == 1.0:
                rows.append(("FLA (docs)", FLA_REFERENCE_ERRORS[r["shape"]]))
            for who, errs in rows:
                if not errs:
                    continue
                worst = None
                if who == "ours" and fla_e:
                    ratios = [errs[t] / fla_e[t] for t in ERROR_TENSORS
                              if errs.get(t) is not None and fla_e.get(t)]
                    worst = max(ratios) if ratios else None
                cells = " | ".join(_fmt(errs.get(t), ".1e") for t in ERROR_TENSORS)
                lines.append(f"| {r['shape']} | {r['config']} | {who} | {cells} | {_fmt(worst, '.2f')} |")

    profiled = [(r, w, scope, p) for r in results for w in ("ours", "fla")
                for scope, p in ((r.get(w) or {}).get("profiles") or {}).items()]
    if profiled:
        lines += ["", "## Per-kernel breakdown (one call, torch.profiler)"]
        for r, who, scope, p in profiled:
            lines += ["", f"### {r['shape']} / {r['config']} / {'ours' if who == 'ours' else 'FLA'} / {scope}: "
                          f"{p['total_ms']:.3f} ms {p['unit']}, {p['num_kernels']} distinct", "",
                      "| kernel | calls | ms | share |", "|---|---:|---:|---:|"]
            for k in p["kernels"]:
                name = k["name"] if len(k["name"]) <= 90 else k["name"][:87] + "..."
                name = name.replace("|", "\\|")
                share = _fmt(k["share"] and 100 * k["share"], ".1f")
                lines.append(f"| `{name}` | {k['calls']} | {k['ms']:.3f} | {share}% |")
            if p.get("other_ms"):
                lines.append(f"| (others) | | {p['other_ms']:.3f} | |")
    return "\n".join(lines) + "\n"


def render_png(data: dict, path: pathlib.Path) -> Optional[str]:
    """Speedup per shape (and the absolute times); returns why it was skipped, or None."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: PNG plot skipped (python -m flash_kda_train.bench --report FILE.json " \
               "regenerates it where matplotlib is)"
    results = data.get("results", [])
    if not results:
        return "no results to plot"
    multi_config = len({r["config"] for r in results}) > 1
    labels = [r["shape"] + (f"\n{r['config']}" if multi_config else "") for r in results]
    xs = list(range(len(results)))
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(8.0, 1.1 * len(results) + 3), 9))
    width = 0.38
    fwd = [(r.get("speedup") or {}).get("fwd") for r in results]
    both = [(r.get("speedup") or {}).get("fwd_bwd") for r in results]
    if any(fwd) or any(both):
        for off, vals, name in ((-width / 2, fwd, "forward"), (width / 2, both, "forward+backward")):
            bars = ax1.bar([x + off for x in xs], [v or 0 for v in vals], width, label=name)
            for b, v in zip(bars, vals):
                ax1.annotate(f"{v:.2f}" if v else "n/a", (b.get_x() + b.get_width() / 2, b.get_height()),
                             ha="center", va="bottom", fontsize=7)
        ax1.axhline(1.0, color="k", lw=0.8, ls="--")
        ax1.set_ylim(0, 1.25 * max([v for v in fwd + both if v] + [1.0]))
        ax1.legend(loc="upper left", ncol=2)
    else:
        ax1.text(0.5, 0.5, "no speedup to show: ours and FLA were not both measured\n(see the markdown table "
                 "for the reasons)", ha="center", va="center", transform=ax1.transAxes)
    ax1.set_ylabel("speedup over FLA (FLA ms / ours ms)")
    ax1.set_xticks(xs, labels, rotation=30, ha="right", fontsize=8)
    env = data.get("environment", {})
    commit = ((data.get("git") or {}).get("commit") or "unknown")[:10]
    ax1.set_title(f"flash_kda_train vs FLA chunk_kda: {env.get('device', '?')}, commit {commit}")

    series = [("ours fwd+bwd", "ours", "fwd_bwd_ms"), ("FLA fwd+bwd", "fla", "fwd_bwd_ms"),
              ("ours fwd", "ours", "fwd_ms"), ("FLA fwd", "fla", "fwd_ms")]
    w = 0.2
    for i, (name, who, key) in enumerate(series):
        vals = [(r.get(who) or {}).get(key) for r in results]
        ax2.bar([x + (i - 1.5) * w for x in xs], [v or 0 for v in vals], w, label=name)
    ax2.set_ylabel("ms (median)")
    ax2.set_xticks(xs, labels, rotation=30, ha="right", fontsize=8)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write_reports(data: dict, json_path: pathlib.Path, md_path: Optional[pathlib.Path],
                  png_path: Optional[pathlib.Path], quiet: bool = False) -> None:
    if md_path is not None:
        md_path.parent.mkdir(parents=True, exist_ok=True)
        md_path.write_text(render_markdown(data))
    if png_path is not None:
        png_path.parent.mkdir(parents=True, exist_ok=True)
        why = render_png(data, png_path)
        if why and not quiet:
            print(why, file=sys.stderr)


def _write_json(data: dict, path: pathlib.Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def report_main(argv: Optional[Sequence[str]] = None) -> int:
    """Regenerates the markdown table and the PNG plot from a JSON result."""
    p = argparse.ArgumentParser(prog="benchmarks/report.py", description=report_main.__doc__)
    p.add_argument("json", type=pathlib.Path)
    p.add_argument("--md", type=pathlib.Path, help="default: the JSON path with .md")
    p.add_argument("--png", type=pathlib.Path, help="default: the JSON path with .png")
    p.add_argument("--no-png", action="store_true")
    args = p.parse_args(argv)
    data = json.loads(args.json.read_text())
    md = args.md or args.json.with_suffix(".md")
    png = None if args.no_png else (args.png or args.json.with_suffix(".png"))
    write_reports(data, args.json, md, png)
    print(render_markdown(data))
    print(f"wrote {md}" + (f" and {png}" if png is not None and png.exists() else ""))
    return 0


# --------------------------------------------------------------------------------------------
# The command


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flash_kda_train bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", help="comma-separated shape names or globs (default: the portfolio); "
                                    "'all' adds the accuracy shapes acc_*; unknown names like B2_T256_H4, "
                                    "B1_T64_H2_HV4 or varlen100x3_H4 are built on the fly")
    p.add_argument("--list", action="store_true", help="list the registered shapes and configurations and exit")
    p.add_argument("--configs", default="default",
                   help=f"comma-separated configurations (default: default); known: {', '.join(CONFIGS)}")
    p.add_argument("--extra", action="store_true", help=f"add the extra rows: {', '.join(EXTRA_CONFIGS)}")
    p.add_argument("--scale", type=float, default=1.0, help="multiply T (each packed length) by this, for quick runs")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda"], help="our backend argument")
    p.add_argument("--impls", default="ours,fla", help="which implementations to run: ours, fla or both")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--dim", type=int, default=128, help="K = V (the protocol's is 128)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--flush-mib", type=int, default=512, help="L2 flush buffer zeroed before each rep (CUDA)")
    p.add_argument("--accuracy", default="auto", choices=["auto", "on", "off"],
                   help="errors against the fp64 CPU gold: 'auto' for shapes with B*T*HV <= --accuracy-limit")
    p.add_argument("--accuracy-limit", type=int, default=150_000,
                   help="token-heads up to which 'auto' computes the gold (about 0.2 ms each on a 2-core CI machine)")
    p.add_argument("--profile", action="store_true", help="per-kernel GPU time of one fwd+bwd (torch.profiler)")
    p.add_argument("--profile-top", type=int, default=25, help="kernels listed per profile")
    p.add_argument("--out", type=pathlib.Path, help="JSON path (default benchmarks/results/<date>.json)")
    p.add_argument("--md", type=pathlib.Path, help="markdown path (default: --out with .md)")
    p.add_argument("--png", type=pathlib.Path, help="PNG path (default: --out with .png)")
    p.add_argument("--no-png", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--segment-size", type=int, help="ours only: chunk_kda(segment_size=N), the call run in "
                                                    "segments of N tokens (a multiple of 64)")
    p.add_argument("--disable-recompute", action="store_true",
                   help="ours only: chunk_kda(disable_recompute=True), the forward's intermediates kept")
    p.add_argument("--forward-pieces", type=int,
                   help="ours only: chunk_kda(forward_pieces=N), the CUDA forward of dense inputs in up to N pieces "
                        "(-1: the planner's choice; docs/design.md, \"The forward in pieces\")")
    p.add_argument("--budget-s", type=float, default=0.0,
                   help="start no new shape after this many seconds (0: no limit); results so far are kept")
    p.add_argument("--git-commit", default=os.environ.get("FKT_GIT_COMMIT"),
                   help="commit to record when the tree is no git checkout (default: $FKT_GIT_COMMIT, else git)")
    p.add_argument("--report", type=pathlib.Path, metavar="JSON",
                   help="only regenerate the markdown and PNG from this JSON file")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.report is not None:
        return report_main([str(args.report)] + (["--md", str(args.md)] if args.md else [])
                           + (["--png", str(args.png)] if args.png else []) + (["--no-png"] if args.no_png else []))
    if args.list:
        for s in PORTFOLIO + ACCURACY_SHAPES:
            print(f"{s.name:32s} {s.describe():50s} {s.why}")
        print()
        for c in CONFIGS.values():
            print(f"{c.name:20s} {c.description}")
        return 0

    shapes = [s.scaled(args.scale) for s in select_shapes(args.shapes)]
    config_names = [c.strip() for c in args.configs.split(",") if c.strip()]
    if args.extra:
        config_names += [c for c in EXTRA_CONFIGS if c not in config_names]
    unknown = [c for c in config_names if c not in CONFIGS]
    if unknown:
        raise SystemExit(f"--configs: unknown {unknown}; known: {', '.join(CONFIGS)}")
    configs = [CONFIGS[c] for c in config_names]
    impls = {i.strip() for i in args.impls.split(",") if i.strip()}
    if not impls <= {"ours", "fla"} or not impls:
        raise SystemExit("--impls: expected ours, fla or ours,fla")

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device visible to torch")
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)

    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H%M%S")
    out = args.out or pathlib.Path("benchmarks/results") / f"{stamp}.json"
    md = args.md or out.with_suffix(".md")
    png = None if args.no_png else (args.png or out.with_suffix(".png"))

    fla_call, fla_reason = (None, "not requested (--impls)")
    if "fla" in impls:
        if device.type != "cuda":
            fla_reason = "FLA's chunk_kda needs Triton on a CUDA device"
        else:
            fla_call, fla_reason = fla_fn()
    ours_options = {}
    if args.segment_size is not None:
        ours_options["segment_size"] = args.segment_size
    if args.disable_recompute:
        ours_options["disable_recompute"] = True
    if args.forward_pieces is not None:
        ours_options["forward_pieces"] = args.forward_pieces
    env = environment(device)
    env["fla"] = _version("fla") if fla_call is not None else None
    data = dict(
        schema=SCHEMA, created=datetime.datetime.now().isoformat(timespec="seconds"),
        argv=list(argv) if argv is not None else sys.argv[1:], git=git_info(args.git_commit), environment=env,
        protocol=dict(timer="CUDA events around the whole call" if device.type == "cuda" else
                      "time.perf_counter around the whole call", warmup=args.warmup, reps=args.reps,
                      statistic="median", flush_mib=args.flush_mib if device.type == "cuda" else 0,
                      dtype=args.dtype, dim=args.dim, scale=args.scale, chunk_size=64, seed=args.seed,
                      forward="timed with autograd recording (inputs require grad), as in training",
                      backward="torch.autograd.grad of (o, final_state) with random do, dht for every input",
                      peak="torch.cuda.max_memory_allocated minus memory_allocated before the call",
                      ours_options=ours_options),
        configs={c.name: dict(description=c.description, **c.options()) for c in configs},
        fla_status=None if fla_call is not None else fla_reason,
        results=[],
    )
    dev = Device(device, args.flush_mib)
    env["copy_tbps"] = dev.copy_rate_tbps()
    print(f"flash_kda_train bench: {len(shapes)} shape(s) x {len(configs)} config(s) on {env['device']}; "
          f"FLA: {env['fla'] if fla_call is not None else fla_reason}; out {out}", flush=True)
    progress = Progress(len(shapes) * len(configs))
    t_start = time.perf_counter()
    stopped = None
    for shape in shapes:
        if args.budget_s and time.perf_counter() - t_start > args.budget_s:
            stopped = f"--budget-s {args.budget_s:g} reached before {shape.name}"
            break
        for config in configs:
            label = f"{shape.name} {config.name}"
            row = dict(shape=shape.name, config=config.name, B=shape.B, T=shape.T, H=shape.H, HV=shape.HV, K=args.dim,
                       V=args.dim, seqlens=list(shape.seqlens) if shape.seqlens else None,
                       token_heads=shape.token_heads)
            x, leaves = make_inputs(shape, config, device, dtype, args.dim, args.seed)
            traffic = minimum_traffic_bytes(x, leaves)
            row["min_traffic_gb"] = {scope: _gb(n) for scope, n in traffic.items()}
            gold = None
            if args.accuracy == "on" or (args.accuracy == "auto" and shape.token_heads <= args.accuracy_limit):
                progress.step(f"{label}: fp64 gold on the CPU")
                t0 = time.perf_counter()
                gold = gold_outputs(x, config)
                row["gold_s"] = time.perf_counter() - t0
            for who in ("ours", "fla"):
                if who not in impls:
                    row[who] = dict(status="skipped", reason="not requested (--impls)")
                    continue
                if who == "fla" and fla_call is None:
                    row[who] = dict(status="unavailable", reason=fla_reason)
                    continue
                progress.step(f"{label}: {who}")
                call = ours_fn(args.backend, ours_options) if who == "ours" else fla_call
                row[who] = measure(dev, call, x, leaves, config, args, gold)
                row[who]["achieved_tbps"] = {scope: _rate(traffic[scope], row[who].get(f"{scope}_ms"))
                                             for scope in traffic}
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            ours, fla = row["ours"], row["fla"]
            row["speedup"] = dict(fwd=_ratio(fla.get("fwd_ms"), ours.get("fwd_ms")),
                                  fwd_bwd=_ratio(fla.get("fwd_bwd_ms"), ours.get("fwd_bwd_ms")))
            data["results"].append(row)
            del x, gold
            progress.advance()
            print(f"  {label}: ours fwd {_status_cell(ours, 'fwd_ms')} fwd+bwd {_status_cell(ours, 'fwd_bwd_ms')} ms"
                  f" | FLA fwd {_status_cell(fla, 'fwd_ms')} fwd+bwd {_status_cell(fla, 'fwd_bwd_ms')} ms"
                  f" (first call {_fmt(fla.get('first_call_s'), '.1f')} s)"
                  f" | speedup fwd {_fmt(row['speedup']['fwd'])}x fwd+bwd {_fmt(row['speedup']['fwd_bwd'])}x",
                  flush=True)
            # Written after every row: a run cut short keeps what it measured.
            data["elapsed_s"] = time.perf_counter() - t_start
            _write_json(data, out)
            write_reports(data, out, md, None)
    progress.close()
    if stopped:
        data["stopped"] = stopped
        print(stopped, flush=True)
    data["elapsed_s"] = time.perf_counter() - t_start
    _write_json(data, out)
    write_reports(data, out, md, png)
    print()
    print(render_markdown(data))
    print(f"wrote {out}, {md}" + (f", {png}" if png is not None and png.exists() else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
