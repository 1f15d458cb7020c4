#!/usr/bin/env python3
"""PyTorch's side of `taper bench products`: the matrix products of a GPT-2
small training step alone, as PyTorch's step runs them (nn.Linear's forward,
and its backward's dx = dy @ W, dW = dy^T @ x and db = dy.sum(0); the tied
head's logits h @ E^T and their backward), timed the same way (the median
of several timings of `reps` calls, the device synchronized around each)
and printed in the same lines.

Bench-only: needs torch (the GPU machine has it). Never run in CI.

    python3 benches/torch_products.py --device cuda --precision bf16
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def timed(dev, reps, rounds, f):
    f()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    times = []
    for _ in range(max(rounds, 1)):
        t0 = time.perf_counter()
        for _ in range(max(reps, 1)):
            f()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / max(reps, 1))
    return statistics.median(times)


def rate(flops):
    return f"{flops / 1e12:.1f} TFLOP/s" if flops >= 1e12 else f"{flops / 1e9:.1f} GFLOP/s"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", choices=list(DTYPES), default="bf16")
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    dev, dt = torch.device(a.device), DTYPES[a.precision]
    r, w = a.rows, a.width
    randn = lambda *s: (torch.randn(*s, device=dev) * 0.1).to(dt)
    groups = []
    with torch.no_grad():
        for name, k, n in (("qkv", w, 3 * w), ("attn proj", w, w), ("mlp fc", w, 4 * w),
                           ("mlp proj", 4 * w, w)):
            x, wt, b, dy = randn(r, k), randn(n, k), randn(n), randn(r, n)
            flops = 2.0 * r * k * n
            fwd = timed(dev, a.reps, a.rounds, lambda: F.linear(x, wt, b))
            bwd = timed(dev, a.reps, a.rounds, lambda: (dy @ wt, dy.t() @ x, dy.sum(0)))
            groups.append((f"{name} forward [{r}x{k}] x [{k}x{n}]", a.layers, flops, fwd))
            groups.append((f"{name} backward (dx, dw, db)", a.layers, 2 * flops, bwd))
        # The tied head as PyTorch's step runs it: the full logits, unpadded.
        v = a.vocab
        head, h, dz = randn(v, w), randn(r, w), randn(r, v)
        flops = 2.0 * r * w * v
        fwd = timed(dev, a.reps, a.rounds, lambda: h @ head.t())
        bwd = timed(dev, a.reps, a.rounds, lambda: (dz @ head, dz.t() @ h))
        groups.append((f"head forward [{r}x{w}] x [{w}x{v}]", 1, flops, fwd))
        groups.append(("head backward (dh, dw)", 1, 2 * flops, bwd))
    secs = flops_total = 0.0
    for name, per_step, flops, s in groups:
        print(f"products torch {name:<48} {s * 1e3:>8.3f} ms  {rate(flops / s):>14}  x{per_step}")
        secs += s * per_step
        flops_total += flops * per_step
    print(f"products torch per step on {a.device} {a.precision}: {secs * 1e3:.2f} ms, "
          f"{flops_total / 1e12:.3f} TFLOP at {rate(flops_total / secs)} (torch {torch.__version__})")


if __name__ == "__main__":
    main()
