"""Command line of flash_kda_train.

    python -m flash_kda_train [options]        the main job: one training step (forward + backward)
                                               of chunk_kda on the best backend present, checked
                                               against the fp64 gold (options: --help)
    python -m flash_kda_train demo [options]   a small KimiDeltaAttention model learns
                                               multi-query associative recall (demo --help)
    python -m flash_kda_train bench [options]  the benchmark (bench --help)
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from . import chunk_kda, has_cuda, reference, version


def _rel_rms(x: torch.Tensor, gold: torch.Tensor) -> float:
    x, gold = x.detach().cpu().double(), gold.double()
    return float((x - gold).norm() / gold.norm().clamp_min(1e-300))


def _inputs(args, device):
    gen = torch.Generator().manual_seed(args.seed)
    B, T, H, HV, K, V = args.batch, args.tokens, args.heads, args.value_heads or args.heads, args.dim, args.dim
    dtype = getattr(torch, args.dtype)

    def randn(*shape, scale=1.0, dt=dtype):
        return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dt)

    q = torch.nn.functional.normalize(randn(B, T, H, K, dt=torch.float32), dim=-1).to(dtype)
    k = torch.nn.functional.normalize(randn(B, T, H, K, dt=torch.float32), dim=-1).to(dtype)
    tensors = dict(
        q=q, k=k, v=randn(B, T, HV, V), g=randn(B, T, HV, K),
        beta=torch.sigmoid(randn(B, T, HV, dt=torch.float32)).to(dtype),
        initial_state=randn(B, HV, K, V, dt=torch.float32),
        A_log=randn(HV, scale=0.5, dt=torch.float32), dt_bias=randn(HV * K, dt=torch.float32),
    )
    for t in tensors.values():
        t.requires_grad_(True)
    return tensors


SUBCOMMANDS = ("demo", "bench")


def main(argv=None) -> int:
    """Runs a subcommand (``demo``, ``bench``) or, without one, the main job."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "demo":
        from . import demo

        return demo.main(argv[1:])
    if argv and argv[0] == "bench":
        try:
            from . import bench
        except ModuleNotFoundError as missing:
            if missing.name != f"{__package__}.bench":
                raise
            print("flash_kda_train bench: the benchmark module (flash_kda_train.bench) is not in this build",
                  file=sys.stderr)
            return 2
        return bench.main(argv[1:])
    return main_job(argv)


def main_job(argv=None) -> int:
    """The main job: one training step checked against the fp64 gold."""
    parser = argparse.ArgumentParser(
        prog="python -m flash_kda_train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="subcommands: " + ", ".join(SUBCOMMANDS) + " (python -m flash_kda_train SUBCOMMAND --help)")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--value-heads", type=int, default=0, help="HV (GVA); default: --heads")
    parser.add_argument("--dim", type=int, default=128, help="K = V")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    # The best backend present: CUDA when this build has it and a GPU is visible, else the CPU.
    on_gpu = args.backend == "cuda" or (args.backend == "auto" and has_cuda() and torch.cuda.is_available())
    device = "cuda" if on_gpu else "cpu"
    x = _inputs(args, device)
    options = dict(use_gate_in_kernel=True, safe_gate=True, lower_bound=-5.0, output_final_state=True)
    print(f"flash_kda_train {version()} (CUDA backend built: {has_cuda()}, GPU visible: {torch.cuda.is_available()})")
    print(f"training step on {device}: B={args.batch} T={args.tokens} H={args.heads} "
          f"HV={args.value_heads or args.heads} K=V={args.dim} {args.dtype}, in-kernel bounded-sigmoid gate "
          f"(lower_bound=-5), fp32 A_log/dt_bias, initial and final state")

    def run_forward():
        return chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                         A_log=x["A_log"], dt_bias=x["dt_bias"], backend=args.backend, **options)

    def clock():
        if on_gpu:
            torch.cuda.synchronize()
        return time.perf_counter()

    if on_gpu:  # the first CUDA call sets kernel attributes: keep it out of the timing
        o, ht = run_forward()
        torch.autograd.backward([o, ht], [torch.ones_like(o), torch.ones_like(ht)])
        for t in x.values():
            t.grad = None
    start = clock()
    o, ht = run_forward()
    forward_s = clock() - start
    gen = torch.Generator().manual_seed(args.seed + 1)
    do = torch.randn(o.shape, generator=gen).to(o)
    dht = torch.randn(ht.shape, generator=gen).to(ht)
    start = clock()
    torch.autograd.backward([o, ht], [do, dht])
    backward_s = clock() - start
    print(f"time: forward {forward_s * 1e3:.1f} ms, backward {backward_s * 1e3:.1f} ms")

    gold_o, gold_ht, gold_grads = reference.gold(x["q"], x["k"], x["v"], x["g"], x["beta"], do=do, dht=dht,
                                                 initial_state=x["initial_state"], A_log=x["A_log"],
                                                 dt_bias=x["dt_bias"], **options)
    errors = {"o": _rel_rms(o, gold_o), "final_state": _rel_rms(ht, gold_ht)}
    for name, leaf in [("dq", "q"), ("dk", "k"), ("dv", "v"), ("dg", "g"), ("dbeta", "beta"), ("dA_log", "A_log"),
                       ("ddt_bias", "dt_bias"), ("dh0", "initial_state")]:
        errors[name] = _rel_rms(x[leaf].grad, getattr(gold_grads, name))
    print("relative RMS error against the fp64 gold (same rounded inputs):")
    for name, err in errors.items():
        print(f"  {name:12s} {err:.2e}")
    # Outputs and gradients are rounded to the input dtype once: bf16 keeps 8 bits (relative
    # rounding error up to 2^-9), fp16 11 bits; fp32 results carry only accumulation error.
    bound = {"bfloat16": 4e-3, "float16": 1e-3, "float32": 1e-4}[args.dtype]
    worst = max(errors.values())
    print(f"worst {worst:.2e} (bound {bound:.0e}): {'PASS' if worst <= bound else 'FAIL'}")
    return 0 if worst <= bound else 1


if __name__ == "__main__":
    sys.exit(main())
