"""A small character-level GPT, trained the way public GPT trainers train one: a script autotune
tunes from outside, without a line of it knowing autotune (studies/chargpt.yaml).

The corpus is the help text that ships with Python (`pydoc_data.topics`: about 465,000
characters of English and code), so nothing is downloaded. Settings are `--key=value`
overrides of the globals below, read as Python literals and checked against each default's type,
as nanoGPT's configurator does; it prints its losses as such trainers do:

    step 200: train loss 2.1512, val loss 2.1833
    iter 210: loss 2.0969, time 41.22ms

Run by hand:

    python train.py --learning_rate=0.003 --batch_size=32 --dtype=bfloat16 --max_iters=1000
"""

from __future__ import annotations

import ast
import contextlib
import math
import sys
import time
from pydoc_data.topics import topics

import torch
from torch import nn
from torch.nn import functional as F

# the model
n_layer = 2
n_head = 4
n_embd = 64
block_size = 64
dropout = 0.0
# the training
learning_rate = 1e-3
batch_size = 32
gradient_accumulation_steps = 1
max_iters = 2000
weight_decay = 0.1
beta2 = 0.99
grad_clip = 1.0
decay_lr = False  # warm-up, then cosine decay to min_lr at lr_decay_iters
warmup_iters = 50
lr_decay_iters = 2000
min_lr = 1e-4
dtype = "float32"  # float32, bfloat16 or float16 (float16 with a gradient scaler)
compile = False
device = "cpu"
seed = 1337
# the evaluation
eval_interval = 100
eval_iters = 10
log_interval = 10


def configure(argv: list[str]) -> None:
    """`--key=value` overrides of this module's settings, each value read as a Python literal
    (text where it is not one) and of its default's type."""
    settings = globals()
    for arg in argv:
        if not arg.startswith("--") or "=" not in arg:
            sys.exit(f"train.py: expected --key=value, got {arg!r}")
        key, text = arg[2:].split("=", 1)
        if key not in settings or key.startswith("_") or callable(settings[key]):
            sys.exit(f"train.py: unknown setting {key!r}")
        try:
            value = ast.literal_eval(text)
        except (SyntaxError, ValueError):
            value = text
        default = settings[key]
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if type(value) is not type(default):
            sys.exit(f"train.py: {key} takes a {type(default).__name__}, got {text!r}")
        settings[key] = value


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd)
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(n_embd, dim=2)
        q, k, v = (z.view(b, t, n_head, c // n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout if self.training else 0.0, is_causal=True
        )
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.mlp(self.ln_2(x)))


class GPT(nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, n_embd)
        self.positions = nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*(Block() for _ in range(n_layer)))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab, bias=False)
        self.head.weight = self.tokens.weight  # tied, as GPT-2's are
        for module in self.modules():  # GPT-2's initialisation: small weights, zero biases
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.blocks(self.tokens(idx) + self.positions(positions))
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def corpus() -> tuple[torch.Tensor, torch.Tensor, int]:
    """The help text as character ids: the first 90% to train on, the rest to validate."""
    text = "".join(topics[name] for name in sorted(topics))
    chars = sorted(set(text))
    lookup = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([lookup[c] for c in text], dtype=torch.long)
    split = int(0.9 * len(ids))
    return ids[:split], ids[split:], len(chars)


def batch(data: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.randint(len(data) - block_size - 1, (batch_size,), generator=generator)
    x = torch.stack([data[s : s + block_size] for s in starts])
    y = torch.stack([data[s + 1 : s + 1 + block_size] for s in starts])
    return x.to(device), y.to(device)


def lr_at(step: int) -> float:
    """Linear warm-up, then cosine decay to min_lr (nanoGPT's schedule); constant without
    decay_lr."""
    if not decay_lr:
        return learning_rate
    if step < warmup_iters:
        return learning_rate * (step + 1) / (warmup_iters + 1)
    if step > lr_decay_iters:
        return min_lr
    ratio = (step - warmup_iters) / max(1, lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def main() -> None:
    configure(sys.argv[1:])
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    train, val, vocab = corpus()
    model = GPT(vocab).to(device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=learning_rate, betas=(0.9, beta2), weight_decay=weight_decay
    )
    step_model = torch.compile(model) if compile else model
    precision = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in precision:
        sys.exit(f"train.py: dtype is one of {', '.join(precision)}, got {dtype!r}")
    autocast = (
        torch.autocast(torch.device(device).type, dtype=precision[dtype])
        if dtype != "float32"
        else contextlib.nullcontext()
    )
    scaler = torch.amp.GradScaler(enabled=dtype == "float16")

    @torch.no_grad()
    def estimate(data: torch.Tensor) -> float:
        model.eval()
        held = torch.Generator().manual_seed(0)  # the same batches at every evaluation
        with autocast:
            losses = [model(*batch(data, held)).item() for _ in range(eval_iters)]
        model.train()
        return sum(losses) / len(losses)

    started = time.perf_counter()
    for step in range(max_iters + 1):
        if step % eval_interval == 0:
            print(
                f"step {step}: train loss {estimate(train):.4f}, val loss {estimate(val):.4f}",
                flush=True,
            )
        if step == max_iters:
            break
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        for _ in range(gradient_accumulation_steps):
            with autocast:
                loss = step_model(*batch(train, generator)) / gradient_accumulation_steps
            scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if step % log_interval == 0:
            elapsed, started = time.perf_counter() - started, time.perf_counter()
            print(
                f"iter {step}: loss {loss.item() * gradient_accumulation_steps:.4f}, "
                f"time {elapsed * 1000 / log_interval:.2f}ms",
                flush=True,
            )


if __name__ == "__main__":
    main()
