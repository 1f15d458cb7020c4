#!/usr/bin/env python3
"""PyTorch reference for scripts/smollm2_qlora.lua's step: PEFT's LoRA over
SmolLM2-135M-Instruct from the same GGUF file, on the CPU. transformers
dequantizes the file to f32 (bitsandbytes' 4-bit types need a GPU, so this is
what PEFT runs on a CPU); rank 8, alpha 16 on q_proj and v_proj, AdamW(fused)
lr 1e-3 without weight decay, batch 4 x 64 tokens, as the recipe. Prints the
seconds of each step, then their median after the first two.

Bench-only, never run in CI. Needs torch and transformers (the test
virtualenv has them) and PyPI's peft, accelerate and gguf:

    pip install --target .bench-pylib --no-deps peft==0.21.2 accelerate==1.15.0 psutil gguf==0.19.0
    PYTHONPATH=.bench-pylib .venv-test/bin/python benches/peft_qlora_step.py --steps 6

Alternate it with taper's recipe (per step: the time between the first
evaluation and the epoch's end in its metrics.jsonl):

    taper train scripts/smollm2_qlora.lua --set steps=6 --set val_windows=1 --out DIR
"""
import argparse
import statistics
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--dir", default="data/smollm2")
a = p.parse_args()

torch.set_num_threads(a.threads)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(
    a.dir, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype=torch.float32
)
model = get_peft_model(
    model,
    LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
)
trained = [q for q in model.parameters() if q.requires_grad]
opt = torch.optim.AdamW(trained, lr=1e-3, weight_decay=0, fused=True)
x = torch.randint(0, model.config.vocab_size, (4, 64))
times = []
for _ in range(a.steps):
    t = time.perf_counter()
    model(input_ids=x, labels=x).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - t)
print("peft lora step s:", " ".join(f"{t:.2f}" for t in times))
print(f"median after warm-up: {statistics.median(times[2:] or times):.2f} s "
      f"({sum(q.numel() for q in trained)} trained parameters)")
