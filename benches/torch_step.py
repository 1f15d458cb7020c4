#!/usr/bin/env python3
"""PyTorch reference for `taper bench step`: the same models, batch shapes and
optimizer, median milliseconds per training step on the CPU.

Bench-only: needs torch (see benches/compare.sh, which makes a virtualenv).
Never run in CI.

    python3 benches/torch_step.py --model mlp --threads 2
"""
import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.fc_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (c // self.heads) ** 0.5
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    """taper's `gpt`: pre-norm blocks, learned positions, tied embeddings, the
    attention written out (as taper's is), tanh GELU (as candle's `gelu`)."""

    def __init__(self, vocab, context, width, layers, heads):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for b in self.blocks:
            x = b(x)
        return self.ln_f(x) @ self.wte.weight.t()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["mlp", "gpt"], default="mlp")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if a.model == "mlp":
        model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
        x, y = torch.randn(128, 784), torch.randint(0, 10, (128,))
        loss_fn = lambda: F.cross_entropy(model(x), y)
    else:
        b, t, v = 32, 128, 65
        model = Gpt(v, t, 128, 4, 4)
        data = torch.randint(0, v, (b, t + 1))
        x, y = data[:, :t], data[:, 1:]
        loss_fn = lambda: F.cross_entropy(model(x).reshape(-1, v), y.reshape(-1))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(3):
        step()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    print(f"torch step {a.model}: median {statistics.median(times) * 1e3:.2f} ms/step "
          f"over {a.steps} steps (threads: {a.threads}, torch {torch.__version__})")


if __name__ == "__main__":
    main()
