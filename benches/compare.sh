#!/usr/bin/env bash
# taper vs PyTorch training-step time on the CPU, run alternately in one
# session (the machines are noisy). Bench-only: makes a virtualenv with torch
# from PyPI (a large download) under .venv-bench/, which git ignores.
#
#   bash benches/compare.sh            # 3 alternating rounds: mlp, cnn, gpt (PyTorch: SDPA, fused AdamW)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-$(nproc)}
if [ ! -x .venv-bench/bin/python ]; then
  python3 -m venv .venv-bench
  .venv-bench/bin/pip install -q torch numpy
fi
cargo build --release -q
for model in mlp cnn gpt; do
  for r in $(seq "$ROUNDS"); do
    RAYON_NUM_THREADS=$THREADS ./target/release/taper bench step --model "$model"
    TAPER_MALLOC_TUNING=0 RAYON_NUM_THREADS=$THREADS ./target/release/taper bench step --model "$model" | sed 's/^/[glibc defaults] /'
    .venv-bench/bin/python benches/torch_step.py --model "$model" --threads "$THREADS"
  done
done
