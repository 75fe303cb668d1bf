"""Bit-for-bit comparison of two CUDA libraries: every output and gradient of fixed calls.

On the GPU machine, once per library (FLASH_KDA_TRAIN_LIBRARY names it), then compare:

    PYTHONPATH=python FLASH_KDA_TRAIN_LIBRARY=old.so python3 scripts/bitdump.py dump /tmp/old.pt
    PYTHONPATH=python FLASH_KDA_TRAIN_LIBRARY=new.so python3 scripts/bitdump.py dump /tmp/new.pt
    python3 scripts/bitdump.py cmp /tmp/old.pt /tmp/new.pt

The calls cover the CUDA backend's paths: bf16 with l2norm in time segments, bf16 varlen with GVA
on head groups, fp16, fp32 with chunks of 32 in time segments, bf16 varlen in sequence groups,
bf16 with precomputed decays steep enough for fwd_intra's element-wise diagonal blocks, and raw
beta with allow_neg_eigval in the [V, K] state layout. `cmp` exits 1 when a tensor differs.
"""

import pathlib
import sys

import torch

CONFIGS = {
    "bf16_l2norm_segments": (
        dict(B=2, T=1100, H=8, K=128, V=128, dtype=torch.bfloat16, gate_in_kernel=True),
        dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, safe_gate=True, lower_bound=-5.0)),
    "bf16_varlen_gva_groups": (
        dict(B=1, T=700, H=48, HV=96, K=128, V=128, dtype=torch.bfloat16, gate_in_kernel=True,
             cu_seqlens=[0, 130, 401, 700]),
        dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, safe_gate=True, lower_bound=-5.0)),
    "fp16": (
        dict(B=1, T=700, H=4, K=128, V=128, dtype=torch.float16, gate_in_kernel=True),
        dict(use_gate_in_kernel=True)),
    "fp32_c32_segments": (
        dict(B=1, T=1200, H=2, K=64, V=64, dtype=torch.float32),
        dict(chunk_size=32)),
    "bf16_varlen_sequence_groups": (
        dict(B=1, T=4921, H=16, K=128, V=128, dtype=torch.bfloat16, gate_in_kernel=True,
             cu_seqlens=[0, 1300, 1847, 3895, 4858, 4921]),
        dict(use_gate_in_kernel=True, safe_gate=True, lower_bound=-5.0)),
    "bf16_steep_precomputed": (
        dict(B=1, T=500, H=4, K=128, V=128, dtype=torch.bfloat16, gate_scale=40.0),
        dict()),
    "bf16_raw_beta_v_first": (
        dict(B=2, T=300, H=4, HV=8, K=128, V=128, dtype=torch.bfloat16, gate_in_kernel=True, beta_logits=True,
             state_v_first=True),
        dict(use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True, state_v_first=True)),
}


def run(index, inputs, options):
    """o, the final state and every gradient of one forward+backward on the CUDA backend."""
    from kda_cases import make_inputs  # tests/python, on the path that main() sets once

    import flash_kda_train as fkt

    torch.manual_seed(index)
    x = {k: v.detach().cuda().requires_grad_(v.requires_grad) if v is not None else None
         for k, v in make_inputs(**inputs).items()}
    o, ht = fkt.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                          output_final_state=True, A_log=x["A_log"], dt_bias=x["dt_bias"],
                          cu_seqlens=x.get("cu_seqlens"), backend="cuda", **options)
    gen = torch.Generator(device="cuda").manual_seed(7)
    do = torch.randn(o.shape, generator=gen, device="cuda").to(o.dtype)
    dht = torch.randn(ht.shape, generator=gen, device="cuda").to(ht.dtype)
    torch.autograd.backward([o, ht], [do, dht])
    out = {"o": o.detach().cpu(), "ht": ht.detach().cpu()}
    out.update({"d" + k: v.grad.cpu() for k, v in x.items() if torch.is_tensor(v) and v.grad is not None})
    return out


def compare(a, b):
    """Lines naming each tensor that differs (or is missing) between two dumps, and a summary."""
    lines, total, equal = [], 0, 0
    for name in sorted(set(a) | set(b)):
        for key in sorted(set(a.get(name, {})) | set(b.get(name, {}))):
            total += 1
            x, y = a.get(name, {}).get(key), b.get(name, {}).get(key)
            if x is None or y is None:
                lines.append(f"MISSING {name} {key}")
            elif x.shape != y.shape or x.dtype != y.dtype:
                lines.append(f"DIFFER {name} {key}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}")
            elif not torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)):
                diff = (x.double() - y.double()).abs().max().item()
                lines.append(f"DIFFER {name} {key}: max abs difference {diff:.3e}")
            else:
                equal += 1
    lines.append(f"{equal}/{total} tensors bitwise equal")
    return lines, equal == total


def main(argv):
    if len(argv) == 2 and argv[0] == "dump":
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "python"))
        dump = {name: run(i, *CONFIGS[name]) for i, name in enumerate(sorted(CONFIGS))}
        torch.save(dump, argv[1])
        return 0
    if len(argv) == 3 and argv[0] == "cmp":
        lines, same = compare(torch.load(argv[1]), torch.load(argv[2]))
        print("\n".join(lines))
        return 0 if same else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
