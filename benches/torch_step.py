#!/usr/bin/env python3
"""PyTorch reference for `taper bench step`: the same models, batch shapes,
optimizer and flags, printing the same figures: median milliseconds per
training step, tokens (or samples) per second, peak memory
(torch.cuda.max_memory_allocated on a GPU) and MFU against a matmul measured
in the same process.

Bench-only: needs torch (benches/compare.sh makes a virtualenv on the CPU
machine; the GPU machine has torch). Never run in CI.

    python3 benches/torch_step.py --model mlp --threads 2
    python3 benches/torch_step.py --model cnn --threads 2
    python3 benches/torch_step.py --model cnn-rgb --threads 2
    python3 benches/torch_step.py --model lenet --threads 2
    python3 benches/torch_step.py --model mnist --threads 2
    python3 benches/torch_step.py --model gpt2 --device cuda --precision bf16
    python3 benches/torch_step.py --model gpt2 --device cuda --precision bf16 --compile

The reference is PyTorch as its users run it: SDPA attention and fused AdamW;
`--attention manual` (the scores written out, as this script once did) and
`--compile` are labelled variants, named in the printed line.
"""
import argparse
import contextlib
import math
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

    def forward(self, x, mask):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        if mask is None:
            # PyTorch as its users run it: SDPA (flash or memory-efficient
            # attention where the device has them).
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            # The labelled `--attention manual` variant: the scores written out.
            att = (q @ k.transpose(-2, -1)) / (c // self.heads) ** 0.5
            att = att.masked_fill(mask, float("-inf")).softmax(-1)
            y = att @ v
        y = y.transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    """taper's `gpt`: pre-norm blocks, learned positions, tied embeddings,
    tanh GELU (as candle's `gelu`); causal attention by SDPA, or written out
    with `manual`."""

    def __init__(self, vocab, context, width, layers, heads, manual=False):
        super().__init__()
        self.context, self.width, self.layers = context, width, layers
        self.manual = manual
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)

    def forward(self, idx):
        t = idx.shape[1]
        mask = (torch.triu(torch.ones(t, t, dtype=torch.bool, device=idx.device), 1)
                if self.manual else None)
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for b in self.blocks:
            x = b(x, mask)
        return self.ln_f(x) @ self.wte.weight.t()


# name: (vocab, context, width, layers, heads, batch), as `taper bench step`.
# input (c, h, w), conv channels, dense hidden widths, kernel, padding, and
# which convolutions a 2x2 max-pool follows (None: each); 10 classes.
CNNS = {
    "cnn": ((1, 28, 28), (8, 16), (64,), 3, 1, None),
    # scripts/image_folder.lua's CNN on 3x64x64 photos (--set size=64 --set channels=3).
    "cnn-rgb": ((3, 64, 64), (16, 32), (128,), 3, 1, None),
    # The net of PyTorch's CIFAR-10 tutorial ("Training a Classifier").
    "lenet": ((3, 32, 32), (6, 16), (120, 84), 5, 0, None),
    # The net of PyTorch's MNIST example (pytorch/examples, mnist/main.py),
    # without its dropout, as the other models.
    "mnist": ((1, 28, 28), (32, 64), (128,), 3, 0, (False, True)),
}

GPTS = {
    "gpt": (65, 128, 128, 4, 4, 32),
    "shakespeare": (65, 64, 64, 2, 4, 32),
    "gpt2": (50257, 1024, 768, 12, 12, 8),
}


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def matmul_ceiling(dev, dtype):
    """FLOP/s of an n x n x n matmul (the same n as taper's)."""
    n = 1024 if dev.type == "cpu" else 8192
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    times = []
    for i in range(8):
        sync(dev)
        t0 = time.perf_counter()
        a @ b
        sync(dev)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times)


def rate(flops):
    return f"{flops / 1e12:.1f} TFLOP/s" if flops >= 1e12 else f"{flops / 1e9:.1f} GFLOP/s"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["mlp", *CNNS, *GPTS], default="mlp")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", choices=["f32", "bf16", "f16"], default="f32")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--context", type=int,
                    help="language models: override the context length")
    ap.add_argument("--attention", choices=["sdpa", "manual"], default="sdpa",
                    help="sdpa (the reference) or the scores written out (a labelled variant)")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model (a labelled variant)")
    ap.add_argument("--profile", action="store_true",
                    help="after timing, print one step's kernels by device time")
    a = ap.parse_args()
    if a.context and a.model not in GPTS:
        ap.error("--context applies to the language models")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dev = torch.device(a.device)
    low = {"bf16": torch.bfloat16, "f16": torch.float16}.get(a.precision)
    if a.model == "mlp":
        b = a.batch or 128
        model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10)).to(dev)
        x, y = torch.randn(b, 784, device=dev), torch.randint(0, 10, (b,), device=dev)
        loss_fn = lambda: F.cross_entropy(model(x).float(), y)
        items, unit = b, "samples"
        flops = 6 * sum(p.numel() for p in model.parameters()) * b
    elif a.model in CNNS:
        # `taper bench step --model cnn|cnn-rgb|lenet|mnist`: convolutions,
        # each with ReLU and (unless told) a 2x2 max-pool, then the dense layers.
        (c, h, w), channels, hidden, k, pad, pools = CNNS[a.model]
        b = a.batch or 64
        layers, macs = [nn.Unflatten(1, (c, h, w))], 0
        for i, o in enumerate(channels):
            layers += [nn.Conv2d(c, o, k, padding=pad), nn.ReLU()]
            h, w = h + 2 * pad - k + 1, w + 2 * pad - k + 1
            macs += k * k * c * o * h * w
            c = o
            if pools is None or pools[i]:
                layers.append(nn.MaxPool2d(2))
                h, w = h // 2, w // 2
        layers.append(nn.Flatten())
        inputs = c * h * w
        for width in hidden:
            layers += [nn.Linear(inputs, width), nn.ReLU()]
            macs += inputs * width
            inputs = width
        layers.append(nn.Linear(inputs, 10))
        macs += inputs * 10
        model = nn.Sequential(*layers).to(dev)
        x = torch.randn(b, math.prod(CNNS[a.model][0]), device=dev)
        y = torch.randint(0, 10, (b,), device=dev)
        loss_fn = lambda: F.cross_entropy(model(x).float(), y)
        items, unit = b, "samples"
        flops = 6 * macs * b
    else:
        v, t, w, layers, heads, b = GPTS[a.model]
        b, t = a.batch or b, a.context or t
        model = Gpt(v, t, w, layers, heads, manual=a.attention == "manual").to(dev)
        data = torch.randint(0, v, (b, t + 1), device=dev)
        x, y = data[:, :t], data[:, 1:]
        loss_fn = lambda: F.cross_entropy(model(x).float().reshape(-1, v), y.reshape(-1))
        items, unit = b * t, "tokens"
        n = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
        flops = (6 * n + 12 * layers * t * w) * b * t
    # Fused AdamW where PyTorch has it (CUDA; the CPU since 2.4).
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, fused=True)
        fused = "fused AdamW"
    except (RuntimeError, TypeError):
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        fused = "AdamW"
    if a.compile:
        model = torch.compile(model)
    variant = ", ".join(
        ([] if a.model == "mlp" or a.model in CNNS else [a.attention + " attention"])
        + [fused] + (["torch.compile"] if a.compile else ["eager"]))
    # Mixed precision as taper's: f32 master weights, low-precision compute,
    # a loss scale for f16.
    autocast = (torch.autocast(device_type=dev.type, dtype=low) if low
                else contextlib.nullcontext())
    scaler = torch.amp.GradScaler(dev.type, enabled=low == torch.float16)

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = loss_fn()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.item()

    ceiling = matmul_ceiling(dev, low or torch.float32)
    for _ in range(3):
        step()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    secs = statistics.median(times)
    peak = (f"{torch.cuda.max_memory_allocated() / 2**20:.1f} MiB" if dev.type == "cuda"
            else "n/a")
    params = sum(p.numel() for p in model.parameters())
    print(f"torch step {a.model} on {a.device} {a.precision} [{variant}]: {secs * 1e3:.2f} ms/step, "
          f"{items / secs:.0f} {unit}/s, peak {peak}, {rate(flops / secs)} = MFU "
          f"{100 * flops / secs / ceiling:.1f}% of a measured {rate(ceiling)} matmul "
          f"({params} parameters, {a.steps} steps, threads {a.threads}, torch {torch.__version__})")
    if a.profile:
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        with profile(activities=acts) as prof:
            step()
        key = "cuda_time_total" if dev.type == "cuda" else "cpu_time_total"
        print(prof.key_averages().table(sort_by=key, row_limit=30, max_name_column_width=70))


if __name__ == "__main__":
    main()
