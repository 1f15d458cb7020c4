#!/usr/bin/env bash
# taper vs PyTorch training-step time on the CPU, run alternately in one
# session (the machines are noisy), then a table of medians and ratios
# (benches/ratios.py). Each round runs taper, taper with glibc's malloc
# defaults (TAPER_MALLOC_TUNING=0: what the malloc tuning buys), PyTorch
# with SDPA and fused AdamW, and the same under torch.compile, a labelled
# variant (COMPILE=0 leaves it out; its warm-up steps include the
# compilation, so its timed steps do not). Bench-only: PyTorch comes from $PYTHON, else
# .venv-test (scripts/fetch-data.sh makes it for the tests), else a
# virtualenv made here with torch from PyPI (a large download) under
# .venv-bench/, which git ignores.
#
#   bash benches/compare.sh                      # 3 rounds of mlp, cnn, gpt, shakespeare
#   MODELS=cnn-rgb bash benches/compare.sh       # image_folder.lua's CNN on 3x64x64 photos
#   MODELS=lenet bash benches/compare.sh         # PyTorch's CIFAR-10 tutorial net (5x5 kernels)
#   MODELS=mnist bash benches/compare.sh         # PyTorch's MNIST example net (one pool after two convs)
#   ROUNDS=5 MODELS="mlp cnn" bash benches/compare.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
COMPILE=${COMPILE:-1}
THREADS=${THREADS:-$(nproc)}
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv-test/bin/python ]; then
    PYTHON=.venv-test/bin/python
  else
    [ -x .venv-bench/bin/python ] || {
      python3 -m venv .venv-bench
      .venv-bench/bin/pip install -q torch numpy
    }
    PYTHON=.venv-bench/bin/python
  fi
fi
cargo build --release -q
log=$(mktemp)
for model in ${MODELS:-mlp cnn gpt shakespeare}; do
  # Enough steps for a stable median at each model's step time.
  case "$model" in
    mlp) steps=300 ;; cnn|lenet) steps=100 ;; cnn-rgb) steps=40 ;; shakespeare) steps=150 ;; *) steps=10 ;;
  esac
  for _ in $(seq "$ROUNDS"); do
    echo "== bench $model f32 batch default"
    RAYON_NUM_THREADS=$THREADS ./target/release/taper bench step --model "$model" --steps "$steps"
    TAPER_MALLOC_TUNING=0 RAYON_NUM_THREADS=$THREADS ./target/release/taper bench step \
      --model "$model" --steps "$steps" | sed -E 's/^(step .* (un)?fused[^ :]*):/\1[glibc-malloc]:/'
    "$PYTHON" benches/torch_step.py --model "$model" --threads "$THREADS" --steps "$steps"
    if [ "$COMPILE" = 1 ]; then
      "$PYTHON" benches/torch_step.py --model "$model" --threads "$THREADS" --steps "$steps" --compile
    fi
  done
done 2>&1 | tee "$log"
python3 benches/ratios.py "$log"
rm -f "$log"
