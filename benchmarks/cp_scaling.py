"""Context-parallel scaling of chunk_kda over NCCL: one long packed sequence split over 1..N GPUs.

For every world size (powers of two up to the GPU count, or --worlds) it spawns one process per GPU
(torch.multiprocessing, NCCL, no torchrun) and times, on every rank, the CP forward and the CP
forward+backward through autograd (benchmarks.md protocol: CUDA events around the whole call, the
512 MiB L2 flush and a barrier before each repetition, warm-ups, median of the repetitions) and
the peak extra memory of one forward+backward. Workload: the benchmark's default configuration
(bf16, K = V = 128, gate in kernel with safe_gate and lower_bound = -5, q/k pre-normalised) without
initial state (context parallelism builds it); the T tokens form one sequence crossing every rank.

    PYTHONPATH=python python benchmarks/cp_scaling.py results.json [--shapes B1_T131072_H32,B1_T32768_H96]

The slowest rank sets a step's time: the table shows the maximum over ranks of the per-rank
medians, the speedup over world size 1 and the scaling efficiency (speedup / world size).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from flash_kda_train import bench, chunk_kda
from flash_kda_train.cp import build_cp_context

DEFAULT_SHAPES = "B1_T131072_H32,B1_T32768_H96"
DIM = 128


def rank_inputs(shape: bench.Shape, rank: int, world: int, device: torch.device):
    """The rank's slice of the default workload (its own random values: timing only)."""
    gen = torch.Generator(device=device).manual_seed(rank)
    T, H, HV = shape.T // world, shape.H, shape.HV

    def randn(*size):
        return torch.randn(*size, generator=gen, device=device)

    x = dict(q=F.normalize(randn(1, T, H, DIM), dim=-1), k=F.normalize(randn(1, T, H, DIM), dim=-1),
             v=randn(1, T, HV, DIM), g=randn(1, T, HV, DIM), beta=torch.sigmoid(randn(1, T, HV)))
    x = {n: t.to(torch.bfloat16) for n, t in x.items()}
    x.update(A_log=0.5 * randn(HV), dt_bias=randn(HV * DIM))
    for t in x.values():
        t.requires_grad_(True)
    return x, randn(1, T, HV, DIM).to(torch.bfloat16)


def time_ms(run, flush: torch.Tensor, warmup: int, reps: int):
    """Per-repetition times of `run` on this rank, every rank starting together."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(reps):
        flush.zero_()
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return times


def measure(shape: bench.Shape, rank: int, world: int, args) -> dict:
    device = torch.device("cuda", rank)
    x, d_o = rank_inputs(shape, rank, world, device)
    ctx = build_cp_context(torch.tensor([0, shape.T], device=device), rank=rank, world_size=world)
    options = bench.CONFIGS["default"].options()
    options.update(output_final_state=False)
    leaves = list(x.values())

    def forward():
        return chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                         cp_context=ctx, **options)[0]

    def step():
        return torch.autograd.grad(forward(), leaves, d_o)

    flush = torch.empty(args.flush_mib << 20, dtype=torch.uint8, device=device)
    fwd = time_ms(forward, flush, args.warmup, args.reps)
    fwd_bwd = time_ms(step, flush, args.warmup, args.reps)
    peak = bench.Device(device, 0).peak_extra_bytes(step)
    return dict(fwd_ms=statistics.median(fwd), fwd_bwd_ms=statistics.median(fwd_bwd), fwd_times_ms=fwd,
                fwd_bwd_times_ms=fwd_bwd, peak_extra_gb_fwd_bwd=peak / 2**30)


def _worker(rank: int, world: int, init_file: str, shapes, args, out_dir: str):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.timeout_s))
    results = {s.name: measure(s, rank, world, args) for s in shapes}
    pathlib.Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


def run_world(world: int, shapes, args):
    """Per-rank results of every shape on `world` GPUs: {shape: [rank 0, rank 1, ...]}."""
    with tempfile.TemporaryDirectory(prefix=f"fkt_cp_scaling{world}_") as out_dir:
        mp.start_processes(_worker, args=(world, os.path.join(out_dir, "init"), shapes, args, out_dir),
                           nprocs=world, start_method="spawn")
        ranks = [json.loads(pathlib.Path(out_dir, f"rank{r}.json").read_text()) for r in range(world)]
    return {s.name: [r[s.name] for r in ranks] for s in shapes}


def summarise(per_rank) -> dict:
    """The slowest rank's medians and the largest peak."""
    return dict(fwd_ms=max(r["fwd_ms"] for r in per_rank), fwd_bwd_ms=max(r["fwd_bwd_ms"] for r in per_rank),
                peak_extra_gb_fwd_bwd=max(r["peak_extra_gb_fwd_bwd"] for r in per_rank), ranks=per_rank)


def markdown(rows) -> str:
    lines = ["| shape | GPUs | tokens/rank | fwd ms | fwd+bwd ms | speedup fwd | speedup fwd+bwd | efficiency fwd+bwd "
             "| peak GiB/rank |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    base = {r["shape"]: r for r in rows if r["world"] == 1}
    for r in rows:
        one = base.get(r["shape"])
        fwd_x = one["fwd_ms"] / r["fwd_ms"] if one else None
        bwd_x = one["fwd_bwd_ms"] / r["fwd_bwd_ms"] if one else None
        cells = [r["shape"], r["world"], r["tokens_per_rank"], f"{r['fwd_ms']:.2f}", f"{r['fwd_bwd_ms']:.2f}",
                 f"{fwd_x:.2f}" if one else "–", f"{bwd_x:.2f}" if one else "–",
                 f"{bwd_x / r['world']:.2f}" if one else "–", f"{r['peak_extra_gb_fwd_bwd']:.2f}"]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=pathlib.Path, help="JSON file to write")
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma-separated B1_T<T>_H<H>[_HV<HV>] names")
    p.add_argument("--worlds", default=None, help="comma-separated world sizes (default: 1, 2, 4, ... <= GPUs)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--flush-mib", type=int, default=512)
    p.add_argument("--timeout-s", type=int, default=600, help="NCCL collective timeout")
    args = p.parse_args(argv)
    gpus = torch.cuda.device_count()
    if gpus < 1:
        print("cp_scaling: needs at least one CUDA GPU", file=sys.stderr)
        return 2
    worlds = ([int(w) for w in args.worlds.split(",")] if args.worlds
              else [w for w in (1, 2, 4, 8, 16, 32) if w <= gpus])
    shapes = [bench.parse_shape(name) for name in args.shapes.split(",")]
    if any(s is None or s.B != 1 or s.seqlens for s in shapes) or any(w > gpus for w in worlds):
        p.error(f"--shapes: expected B1_T<T>_H<H> names, got {args.shapes}; --worlds: at most {gpus} GPUs")
    data = dict(environment=bench.environment(torch.device("cuda", 0)), git=bench.git_info(None),
                protocol=dict(warmup=args.warmup, reps=args.reps, flush_mib=args.flush_mib, statistic="median",
                              across_ranks="max of the per-rank medians", dtype="bfloat16", dim=DIM,
                              config="default without initial state", layout="one sequence over all ranks"),
                rows=[], skipped=[])
    for world in worlds:
        fitting = [s for s in shapes if s.T % world == 0]
        data["skipped"] += [dict(shape=s.name, world=world, reason=f"T = {s.T} is not a multiple of {world}")
                            for s in shapes if s.T % world]
        for name, per_rank in run_world(world, fitting, args).items():
            data["rows"].append(dict(shape=name, world=world, tokens_per_rank=bench.parse_shape(name).T // world,
                                     **summarise(per_rank)))
        args.out.write_text(json.dumps(data, indent=1))
    print(markdown(sorted(data["rows"], key=lambda r: (r["shape"], r["world"]))))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
