"""The demo: a small model of KimiDeltaAttention layers learns multi-query associative recall.

MQAR (multi-query associative recall): each sequence lists key-value pairs, then asks for the
values of some of its keys; the model must answer each query with the value that followed that
key earlier in the sequence. Without recall the best guess is one of the sequence's values, so
chance accuracy is 1 / pairs. Data is generated on the fly from a seed.

    python -m flash_kda_train demo            # 800 steps, about 1.5 minutes on 2 CPU cores
    python -m flash_kda_train demo --help

The model runs on the GPU when one is present and the library's CUDA backend serves chunk_kda
(a tiny probe call decides), otherwise on the CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from . import has_cuda, version
from .api import chunk_kda
from .nn import KimiDeltaAttention


@dataclasses.dataclass
class DemoConfig:
    steps: int = 800
    batch: int = 32
    pairs: int = 12           # key-value pairs per sequence
    queries: int = 12         # queries per sequence
    keys: int = 48            # key vocabulary
    values: int = 48          # value vocabulary
    hidden: int = 64
    layers: int = 2
    heads: int = 2
    head_dim: int = 32
    lr: float = 1e-2
    eval_every: int = 50
    eval_batch: int = 256
    seed: int = 0
    device: str = "auto"
    progress: bool = True


# ---- data ------------------------------------------------------------------------------------

def mqar_batch(cfg: DemoConfig, batch: int, generator: torch.Generator):
    """Token ids ``[batch, 2*pairs + queries]`` and targets (-100 except at the query positions).

    Tokens ``0 .. keys-1`` are keys and ``keys .. keys+values-1`` values. A sequence is
    ``k1 v1 k2 v2 ... kP vP q1 ... qQ``: P distinct keys, random values, then Q keys drawn
    from the P (repeats allowed); the target at query ``qj`` is the value paired with it.
    """
    keys = torch.rand(batch, cfg.keys, generator=generator).argsort(-1)[:, :cfg.pairs]
    values = torch.randint(cfg.keys, cfg.keys + cfg.values, (batch, cfg.pairs), generator=generator)
    asked = torch.randint(0, cfg.pairs, (batch, cfg.queries), generator=generator)
    context = torch.stack([keys, values], dim=-1).flatten(1)
    tokens = torch.cat([context, keys.gather(1, asked)], dim=1)
    targets = torch.full_like(tokens, -100)
    targets[:, 2 * cfg.pairs:] = values.gather(1, asked)
    return tokens, targets


# ---- model -----------------------------------------------------------------------------------

class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """Pre-norm residual block: KDA, then a gated MLP (the layout of FLA's KDA model)."""

    def __init__(self, cfg: DemoConfig, layer_idx: int):
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.hidden, eps=1e-5)
        self.attn = KimiDeltaAttention(hidden_size=cfg.hidden, head_dim=cfg.head_dim, num_heads=cfg.heads,
                                       layer_idx=layer_idx)
        self.mlp_norm = nn.RMSNorm(cfg.hidden, eps=1e-5)
        self.mlp = GatedMLP(cfg.hidden, 2 * cfg.hidden)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))[0]
        return x + self.mlp(self.mlp_norm(x))


class MQARModel(nn.Module):
    def __init__(self, cfg: DemoConfig):
        super().__init__()
        vocab = cfg.keys + cfg.values
        self.embeddings = nn.Embedding(vocab, cfg.hidden)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.layers))
        self.norm = nn.RMSNorm(cfg.hidden, eps=1e-5)
        self.lm_head = nn.Linear(cfg.hidden, vocab, bias=False)

    def forward(self, tokens):
        x = self.embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


# ---- device ----------------------------------------------------------------------------------

def cuda_serves_chunk_kda() -> bool:
    """True when a GPU is visible and a tiny chunk_kda call (forward and backward) runs on it."""
    if not (torch.cuda.is_available() and has_cuda()):
        return False
    try:
        shape = (1, 16, 1, 16)
        q, k, v, g = (torch.randn(shape, device="cuda", requires_grad=True) for _ in range(4))
        beta = torch.rand(1, 16, 1, device="cuda", requires_grad=True)
        o, _ = chunk_kda(q, k, v, torch.nn.functional.logsigmoid(g), beta, use_qk_l2norm_in_kernel=True)
        o.sum().backward()
        torch.cuda.synchronize()
        return True
    except (ValueError, RuntimeError, NotImplementedError):
        return False


def pick_device(requested: str) -> torch.device:
    if requested != "auto":
        return torch.device(requested)
    return torch.device("cuda" if cuda_serves_chunk_kda() else "cpu")


# ---- progress --------------------------------------------------------------------------------

class Progress:
    """A one-line progress bar on a terminal; a line per tenth of the run otherwise."""

    def __init__(self, total: int, enabled: bool = True, stream=None, width: int = 30):
        self.total, self.enabled, self.width = total, enabled, width
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.start = time.perf_counter()
        self.last_line = -1

    def update(self, step: int, text: str):
        if not self.enabled:
            return
        done = int(self.width * step / self.total)
        elapsed = time.perf_counter() - self.start
        eta = elapsed / step * (self.total - step) if step else 0.0
        line = (f"[{'#' * done}{'.' * (self.width - done)}] {step}/{self.total} "
                f"{elapsed:5.0f}s <{eta:4.0f}s  {text}")
        if self.tty:
            self.stream.write("\r" + line + ("\n" if step == self.total else ""))
            self.stream.flush()
        else:
            tenth = 10 * step // self.total
            if tenth != self.last_line:
                self.last_line = tenth
                print(line, file=self.stream, flush=True)


# ---- training --------------------------------------------------------------------------------

@dataclasses.dataclass
class History:
    steps: List[int] = dataclasses.field(default_factory=list)
    loss: List[float] = dataclasses.field(default_factory=list)        # training loss per step
    eval_steps: List[int] = dataclasses.field(default_factory=list)
    accuracy: List[float] = dataclasses.field(default_factory=list)    # held-out query accuracy
    chance: float = 0.0
    device: str = "cpu"
    seconds: float = 0.0


@torch.no_grad()
def evaluate(model, tokens, targets) -> float:
    model.eval()
    logits = model(tokens)
    model.train()
    asked = targets != -100
    return float((logits.argmax(-1)[asked] == targets[asked]).float().mean())


def train(cfg: DemoConfig, log=print) -> History:
    torch.manual_seed(cfg.seed)
    device = pick_device(cfg.device)
    model = MQARModel(cfg).to(device)
    data_gen = torch.Generator().manual_seed(cfg.seed + 1)
    eval_tokens, eval_targets = (t.to(device) for t in mqar_batch(cfg, cfg.eval_batch,
                                                                  torch.Generator().manual_seed(cfg.seed + 2)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, cfg.steps // 20)

    def lr_at(step):  # linear warmup, cosine decay to 10%
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.45 * (1 + math.cos(math.pi * (step - warmup) / max(1, cfg.steps - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    history = History(chance=1.0 / cfg.pairs, device=str(device))
    log(f"model: {cfg.layers} x KimiDeltaAttention (hidden {cfg.hidden}, {cfg.heads} heads of {cfg.head_dim}) "
        f"+ gated MLP, {sum(p.numel() for p in model.parameters()) / 1e3:.0f}k parameters, on {device}")
    log(f"task: MQAR, {cfg.pairs} key-value pairs then {cfg.queries} queries (sequence length "
        f"{2 * cfg.pairs + cfg.queries}), {cfg.keys} keys, {cfg.values} values, batch {cfg.batch}; "
        f"chance accuracy {history.chance:.1%}")
    history.eval_steps.append(0)
    history.accuracy.append(evaluate(model, eval_tokens, eval_targets))
    bar = Progress(cfg.steps, enabled=cfg.progress)
    start = time.perf_counter()
    for step in range(1, cfg.steps + 1):
        tokens, targets = (t.to(device) for t in mqar_batch(cfg, cfg.batch, data_gen))
        logits = model(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        history.steps.append(step)
        history.loss.append(loss.item())
        if step % cfg.eval_every == 0 or step == cfg.steps:
            history.eval_steps.append(step)
            history.accuracy.append(evaluate(model, eval_tokens, eval_targets))
        bar.update(step, f"loss {history.loss[-1]:.3f}  recall accuracy {history.accuracy[-1]:6.1%}")
    history.seconds = time.perf_counter() - start
    return history


def main(argv: Optional[List[str]] = None) -> int:
    defaults = DemoConfig()
    parser = argparse.ArgumentParser(prog="python -m flash_kda_train demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for field in dataclasses.fields(DemoConfig):
        if field.name == "progress":
            continue
        flag = "--" + field.name.replace("_", "-")
        parser.add_argument(flag, type=type(getattr(defaults, field.name)), default=getattr(defaults, field.name),
                            help=f"default: {getattr(defaults, field.name)}")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = vars(parser.parse_args(argv))
    cfg = DemoConfig(progress=not args.pop("no_progress"), **args)

    print(f"flash_kda_train {version()} demo (CUDA backend built: {has_cuda()}, "
          f"GPU visible: {torch.cuda.is_available()})")
    history = train(cfg)
    first, last = history.accuracy[0], history.accuracy[-1]
    head = sum(history.loss[:10]) / max(1, len(history.loss[:10]))
    tail = sum(history.loss[-10:]) / max(1, len(history.loss[-10:]))
    print(f"trained {cfg.steps} steps in {history.seconds:.0f} s on {history.device}: "
          f"loss {head:.3f} -> {tail:.3f} (mean of first/last 10 steps)")
    print("held-out recall accuracy: " + ", ".join(
        f"{a:.0%}@{s}" for s, a in zip(history.eval_steps, history.accuracy)
        if s in (0, cfg.steps) or s % max(cfg.eval_every, cfg.steps // 6 // cfg.eval_every * cfg.eval_every) == 0))
    learned = last >= max(0.5, 3 * history.chance)
    print(f"recall accuracy {first:.1%} -> {last:.1%} (chance {history.chance:.1%}): "
          f"{'learned' if learned else 'not learned yet (try more --steps)'}")
    return 0 if learned else 1


if __name__ == "__main__":
    sys.exit(main())
