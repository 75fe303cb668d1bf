"""How much of a timed training forward is the host's: each call of the benchmark's workload timed
as the benchmark times it (L2 flushed, the GPU idle, CUDA events around the call), then again behind
a GPU sleep that hides the host's work (the GPU span of the call's kernels), with the host time of
the call itself. Medians of --reps calls, the two timings alternating.

    python3 benchmarks/host_probe.py --impls ours,pieces --shapes B2_T16384_H16,B4_T2048_H16
"""

import argparse
import statistics
import time

import torch

from flash_kda_train import bench


def _sleep():
    torch.cuda._sleep(3_000_000)  # about 1.5 ms on an H200: the call is queued behind it


def probe(device: bench.Device, call, x, config, reps: int) -> dict:
    for _ in range(3):
        call(x, config)
    device.sync()
    host = []  # of the calls timed with the GPU idle

    def run(hosts: list):
        t0 = time.perf_counter()
        out = call(x, config)
        hosts.append((time.perf_counter() - t0) * 1e3)
        return out

    timed, gpu_span = [], []
    for _ in range(reps):
        timed += device.time_ms(lambda: run(host), 1)
        gpu_span += device.time_ms(lambda: run([]), 1, queue_first=_sleep)
    return {"timed": statistics.median(timed), "gpu_span": statistics.median(gpu_span),
            "host": statistics.median(host)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impls", default="ours",
                   help="ours, pieces (ours with forward_pieces=-1: docs/design.md, \"The forward in pieces\") or "
                        "fla, comma-separated")
    p.add_argument("--shapes", default="B2_T16384_H16,B4_T2048_H16,B1_T8192_H96")
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    device = bench.Device(torch.device("cuda"), 512)
    config = bench.CONFIGS["default"]
    calls = {"ours": bench.ours_fn("auto", {}), "pieces": bench.ours_fn("auto", {"forward_pieces": -1})}
    if "fla" in args.impls:
        fla, reason = bench.fla_fn()
        if fla is None:
            raise SystemExit(reason)
        calls["fla"] = fla
    for shape in bench.select_shapes(args.shapes):
        x, _ = bench.make_inputs(shape, config, device.device, torch.bfloat16, 128, 0)
        for impl in args.impls.split(","):
            r = probe(device, calls[impl], x, config, args.reps)
            print(f"{shape.name:16s} {impl:6s} timed {r['timed']:.3f} ms, GPU span {r['gpu_span']:.3f} ms, "
                  f"host {r['host']:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
