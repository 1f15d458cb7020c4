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

With `--chat FILE.jsonl --batch 8 --lr 2e-3`, the reference for
scripts/smollm2_chat.lua's step: the file's conversations rendered with the
GGUF's chat template by transformers' apply_chat_template, cut at
`--context` + 1 tokens and padded to the longest of their batch (as TRL's
collator pads), labels -100 outside the assistant's replies (the loss then
leaves them out, as TRL's assistant_only_loss does). Alternate it with

    taper train scripts/smollm2_chat.lua --set data=FILE.jsonl --set epochs=1 --set answers=0 --log-every 1 --out DIR

(`step_s` of the `step` records).
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
p.add_argument("--batch", type=int, default=4)
p.add_argument("--context", type=int, default=64)
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--chat", help="a JSON Lines file of conversations (TRL's messages)")
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
opt = torch.optim.AdamW(trained, lr=a.lr, weight_decay=0, fused=True)


def chat_batches():
    """Batches of (input ids, attention mask, labels) from the chat file."""
    import json

    from gguf import GGUFReader
    from transformers import PreTrainedTokenizerFast

    f = GGUFReader(f"{a.dir}/SmolLM2-135M-Instruct.Q4_1.gguf").fields["tokenizer.chat_template"]
    template = bytes(f.parts[f.data[0]]).decode()
    tok = PreTrainedTokenizerFast(tokenizer_file=f"{a.dir}/tokenizer.json")
    rows = []
    for line in open(a.chat, encoding="utf-8"):
        messages = json.loads(line)["messages"]
        ids = tok.apply_chat_template(messages, chat_template=template, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)[: a.context + 1]
        labels = [-100] * len(ids)
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            before = tok.apply_chat_template(messages[:i], chat_template=template,
                                             add_generation_prompt=True, tokenize=True)
            upto = tok.apply_chat_template(messages[: i + 1], chat_template=template, tokenize=True)
            n0 = len(before["input_ids"] if hasattr(before, "keys") else before)
            n1 = len(upto["input_ids"] if hasattr(upto, "keys") else upto)
            labels[n0:n1] = ids[n0:n1]
        rows.append((ids, labels[: len(ids)]))
    for k in range(0, len(rows) - a.batch + 1, a.batch):
        part = rows[k : k + a.batch]
        longest = max(len(ids) for ids, _ in part)
        pads = [longest - len(ids) for ids, _ in part]
        yield (
            torch.tensor([ids + [0] * p for (ids, _), p in zip(part, pads)]),
            torch.tensor([[1] * len(ids) + [0] * p for (ids, _), p in zip(part, pads)]),
            torch.tensor([labels + [-100] * p for (_, labels), p in zip(part, pads)]),
        )


if a.chat:
    batches = list(chat_batches())
else:
    x = torch.randint(0, model.config.vocab_size, (a.batch, a.context))
    batches = [(x, torch.ones_like(x), x)]
times = []
for s in range(a.steps):
    t = time.perf_counter()
    x, mask, labels = batches[s % len(batches)]
    model(input_ids=x, attention_mask=mask, labels=labels).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - t)
print("peft lora step s:", " ".join(f"{t:.2f}" for t in times))
print(f"mean after warm-up: {statistics.mean(times[2:] or times):.2f} s")
print(f"median after warm-up: {statistics.median(times[2:] or times):.2f} s "
      f"({sum(q.numel() for q in trained)} trained parameters)")
