"""Forward and backward of the CUDA backend on small shapes that reach every padding and tail path
(odd head dims, chunk 32 and 64, ragged varlen packs, length-1 sequences, GVA, state layouts, head
groups, time segments and sequence groups of the backward, the forward in pieces and in time slices), and
the context-parallel summaries and fold on the same shapes, for compute-sanitizer
(scripts/memcheck.sh). Exits non-zero if an output is not finite."""

import sys

import torch

import flash_kda_train as fkt
from flash_kda_train import _core, cp

CASES = [
    dict(B=2, T=100, H=2, HV=2, K=16, V=16),
    dict(B=1, T=130, H=2, HV=4, K=100, V=36, chunk_size=32),
    dict(B=1, T=97, H=1, HV=1, K=8, V=24, state_v_first=True),
    dict(B=1, T=200, H=2, HV=2, K=128, V=128, cu_seqlens=[0, 1, 64, 65, 200]),
    dict(B=1, T=70, H=1, HV=2, K=64, V=72, cu_seqlens=[0, 0, 3, 3, 70], chunk_size=32),
    dict(B=1, T=90, H=1, HV=2, K=30, V=13),
    # Enough sequences x heads for fwd_state's wgmma pass to take 64-column V-tiles (288 blocks).
    dict(B=1, T=400, H=8, HV=16, K=128, V=128, cu_seqlens=[0, 1, 64, 65, 130, 200, 257, 300, 333, 400]),
    # The backward in two time segments (cuda/sm90/segments.hpp): 19 and 18 chunks, the last range
    # ending inside a chunk, on the mma.sync and the wgmma passes.
    dict(B=2, T=600, H=1, HV=2, K=64, V=72, chunk_size=32),
    dict(B=2, T=1100, H=1, HV=2, K=128, V=128),
    # The same forward in three pieces of 6, 6 and 6 chunks (cuda/sm90/forward/pieces.hpp).
    dict(B=2, T=1100, H=1, HV=2, K=128, V=128, forward_pieces=3),
    # Three time slices of 17, 17 and 15 chunks, side by side from the fold of the first two's summaries.
    dict(B=1, T=3109, H=1, HV=2, K=128, V=128, forward_pieces=-1),
    # The backward on three sequence groups (cuda/sm90/sequence_groups.hpp) of 8, 11 and 10 chunks,
    # each giving an H200's 132 SMs a block (4 V-tiles x 36 value heads a sequence).
    dict(B=1, T=800, H=36, HV=36, K=64, V=128, cu_seqlens=[0, 1, 1, 200, 330, 500, 640, 800], chunk_size=32),
]


def run(B, T, H, HV, K, V, chunk_size=64, state_v_first=False, cu_seqlens=None, forward_pieces=1,
        forward_only=False):
    torch.manual_seed(0)
    dev = "cuda"
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    q = torch.randn(B, T, H, K, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, T, H, K, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, T, HV, V, device=dev, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(B, T, HV, K, device=dev, dtype=torch.bfloat16, requires_grad=True)
    beta = torch.randn(B, T, HV, device=dev, dtype=torch.bfloat16, requires_grad=True)
    shape = (N, HV, V, K) if state_v_first else (N, HV, K, V)
    h0 = torch.randn(*shape, device=dev, requires_grad=True)
    A_log = torch.randn(HV, device=dev, requires_grad=True)
    dt_bias = torch.randn(HV * K, device=dev, requires_grad=True)
    offsets = None if cu_seqlens is None else torch.tensor(cu_seqlens, device=dev)
    o, ht = fkt.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, use_gate_in_kernel=True,
                          A_log=A_log, dt_bias=dt_bias, safe_gate=True, lower_bound=-5.0, use_beta_sigmoid_in_kernel=True,
                          use_qk_l2norm_in_kernel=True, chunk_size=chunk_size, cu_seqlens=offsets,
                          state_v_first=state_v_first, forward_pieces=forward_pieces)
    if forward_only:
        torch.cuda.synchronize()
        return bool(torch.isfinite(o).all() and torch.isfinite(ht).all())
    torch.autograd.backward([o, ht], [torch.randn_like(o), torch.randn_like(ht)])
    torch.cuda.synchronize()
    tensors = [o, ht, q.grad, k.grad, v.grad, g.grad, beta.grad, h0.grad, A_log.grad, dt_bias.grad]
    # The CP summaries of every sequence and their folds (widened V + K columns, tiles past V).
    cfg = _core.Config(scale=K ** -0.5, chunk_size=chunk_size, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                       use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=-5.0)
    inputs = _core.Inputs(q.detach(), k.detach(), v.detach(), g.detach(), beta.detach(), A_log.detach(),
                          dt_bias.detach(), None, offsets, None if offsets is None else offsets.cpu())
    for n in range(N):
        d_o = torch.randn_like(o)
        sums = torch.stack([cp.forward_summary(cfg, inputs, n), cp.backward_summary(cfg, inputs, d_o, n)])
        for backward in (False, True):
            tensors.append(cp.fold(sums, 0, 2, backward, state_v_first, torch.empty(shape[1:], device=dev)))
    torch.cuda.synchronize()
    return all(bool(torch.isfinite(t).all()) for t in tensors)


if __name__ == "__main__":
    # All cases, or those whose indices are given (for a slower sanitizer tool); --forward: their
    # forward alone (racecheck of the forward's pieces and slices, without the backward and the
    # summaries that take it past a minute a case).
    args = sys.argv[1:]
    forward_only = "--forward" in args
    chosen = [CASES[int(i)] for i in args if i != "--forward"] or CASES
    bad = [case for case in chosen if not run(**case, forward_only=forward_only)]
    print(f"{len(chosen) - len(bad)} of {len(chosen)} cases finite" + (f"; not finite: {bad}" if bad else ""))
    sys.exit(1 if bad else 0)
