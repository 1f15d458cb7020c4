#!/usr/bin/env python3
"""PyTorch reference for scripts/minilm_classify.lua's step: transformers'
BertForSequenceClassification over MiniLM (data/minilm), every weight
trained by AdamW(fused) lr 1e-4 and weight decay 0.01, on the first `--rows`
passages of data/austen/train.csv, tokenized with truncation at `--context`,
shuffled, in batches of 16 padded to their longest (transformers'
DataCollatorWithPadding), on the CPU, with the config's dropout (0.1) as
transformers' Trainer runs it and taper's recipe trains (`--no-dropout`: off,
against the recipe's `--set dropout=0`;
`--compile`: the model through `torch.compile`, best at a fixed width,
`--context 64`, where it compiles once). Prints
each step's seconds, then the mean and median after the first two.

Bench-only, never run in CI. Needs torch and transformers (the test
virtualenv has them):

    .venv-test/bin/python benches/bert_classify_step.py --rows 320

Alternate it with taper's recipe, in the same order of batches' kinds (a
plain shuffle; `step_s` of the `step` records, after the first two):

    taper train scripts/minilm_classify.lua --set rows=320 --set test_rows=16 \
        --set epochs=1 --set group=false --log-every 1 --out DIR
"""
import argparse
import csv
import random
import statistics
import time

import torch
from transformers import AutoTokenizer, BertForSequenceClassification

p = argparse.ArgumentParser()
p.add_argument("--rows", type=int, default=320)
p.add_argument("--batch", type=int, default=16)
p.add_argument("--context", type=int, default=128)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--model", default="data/minilm")
p.add_argument("--data", default="data/austen/train.csv")
p.add_argument("--no-dropout", action="store_true")
p.add_argument("--seed", type=int, default=1)
p.add_argument("--compile", action="store_true", help="torch.compile the model (a labelled variant)")
a = p.parse_args()

torch.set_num_threads(a.threads)
torch.manual_seed(0)
rows = list(csv.DictReader(open(a.data, newline="")))[: a.rows]
classes = sorted({r["novel"] for r in rows})
labels = [classes.index(r["novel"]) for r in rows]
tok = AutoTokenizer.from_pretrained(a.model)
enc = tok([r["text"] for r in rows], truncation=True, max_length=a.context)["input_ids"]

extra = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0} if a.no_dropout else {}
model = BertForSequenceClassification.from_pretrained(a.model, num_labels=len(classes), **extra)
model.train()
if a.compile:
    model = torch.compile(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)

order = list(range(len(rows)))
random.Random(a.seed).shuffle(order)
times = []
for start in range(0, len(order) - a.batch + 1, a.batch):
    idx = order[start : start + a.batch]
    width = max(len(enc[i]) for i in idx)
    ids = torch.zeros(len(idx), width, dtype=torch.long)
    for r, i in enumerate(idx):
        ids[r, : len(enc[i])] = torch.tensor(enc[i])
    mask = (ids != tok.pad_token_id).long()
    y = torch.tensor([labels[i] for i in idx])
    t = time.perf_counter()
    loss = model(input_ids=ids, attention_mask=mask, labels=y).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - t)
    print(f"step {len(times)}: {times[-1]:.3f} s, width {width}, loss {loss.item():.4f}", flush=True)
rest = times[2:]
print(f"mean {statistics.mean(rest):.3f} s, median {statistics.median(rest):.3f} s over {len(rest)} steps "
      f"(dropout {'off' if a.no_dropout else '0.1'}{', torch.compile' if a.compile else ''}, torch {torch.__version__})")
