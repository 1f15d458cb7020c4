#!/usr/bin/env bash
# The GPU checks of the CUDA path, for a session that is lent a GPU machine
# (which has the driver, python3 with torch and its CUDA 13 libraries, but no
# cargo and no network). Two halves:
#
#   bash scripts/gpu-check.sh pack          # here: build the CUDA binary and
#                                           # the GPU tests, xz them into .gpu/
#   bash scripts/gpu-check.sh run [PARTS]   # on the GPU machine, with .gpu
#                                           # carried; PARTS of: tests drill bench
#                                           # (default: all three)
#
# `run` writes everything to $OUT/gpu-check.log when OUT is set (the device
# tool's output folder), else to stdout. The binaries are about 70 MB each,
# mostly candle's PTX; xz brings them to about 9 MB, under the carry limit.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
pack_dir="$root/.gpu"

pack() {
  eval "$(bash scripts/cuda-toolchain.sh)"
  cargo build --release --features cuda --target-dir target/cuda -p taper
  local test_bin
  test_bin="$(cargo test --release --features cuda --target-dir target/cuda -p taper \
    --test cuda_kernels --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "cuda_kernels":
        print(m["executable"])')"
  [ -x "$test_bin" ] || { echo "gpu-check: the cuda_kernels test did not build" >&2; exit 1; }
  mkdir -p "$pack_dir"
  for pair in "target/cuda/release/taper:taper" "$test_bin:cuda_kernels"; do
    strip -o "$pack_dir/${pair##*:}" "${pair%%:*}"
    xz -T0 -6 -f "$pack_dir/${pair##*:}"
  done
  ls -la "$pack_dir"
}

# On the GPU machine: torch's CUDA 13 libraries (cudart, cublas, curand).
cuda_libs() {
  python3 - <<'PY'
import os, nvidia
for base in nvidia.__path__:
    lib = os.path.join(base, "cu13", "lib")
    if os.path.isdir(lib):
        print(lib)
        break
PY
}

tests() {
  echo "== no GPU visible: the CUDA build must fail in one line"
  set +e
  CUDA_VISIBLE_DEVICES= "$bin/taper" train scripts/digits.lua --device cuda --quiet
  echo "exit $?"
  set -e
  echo "== kernels against their CPU references, AdamW, digits on the GPU"
  "$bin/cuda_kernels" --test-threads=1 --nocapture
  echo "== the main job on the GPU"
  for p in f32 bf16; do
    "$bin/taper" train scripts/digits.lua --device cuda --set precision=$p --out /tmp/digits-$p
  done
}

# A real CUDA OOM, recovered: the same short Shakespeare run without a limit,
# then under --mem-limit at 60% and 35% of the unconstrained run's pool peak
# (the rest of the card is taken as ballast). The final losses should agree:
# the split batches give the same gradient.
drill() {
  local set=(--set steps=30 --set sample=0 --set epochs=1 --set width=512 --set layers=6
             --set heads=8 --set context=256 --set batch=64)
  local peak=""
  for frac in none 0.60 0.35; do
    local args=() out="/tmp/drill-$frac"
    if [ "$frac" != none ]; then
      [ -n "$peak" ] || { echo "gpu-check: no device_memory_peak from the unconstrained run" >&2; return 1; }
      args=(--mem-limit "$(python3 -c "print(int($peak * $frac))")")
    fi
    echo "== shakespeare drill, limit ${args[*]:-none}"
    rm -rf "$out"
    set +e
    "$bin/taper" train scripts/shakespeare.lua --device cuda --quiet --out "$out" \
      "${set[@]}" "${args[@]}"
    echo "exit $?"
    set -e
    python3 - "$out/metrics.jsonl" <<'PY' || true
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
pick = lambda e: [r for r in recs if r["event"] == e]
ooms, epochs, evals = pick("oom"), pick("epoch"), pick("eval")
last = epochs[-1] if epochs else {}
print(f"  {len(ooms)} OOMs; epoch loss {last.get('loss')}; pool peak "
      f"{last.get('device_memory_peak')}; eval loss {evals[-1]['loss'] if evals else None}")
for r in ooms[:3]:
    print("  oom:", json.dumps(r))
PY
    if [ "$frac" = none ]; then
      peak="$(python3 -c "import json,sys
print(max((json.loads(l).get('device_memory_peak') or 0) for l in open(sys.argv[1])))" "$out/metrics.jsonl" 2>/dev/null || true)"
    fi
  done
}

bench() {
  for model in shakespeare gpt2; do
    for p in f32 bf16; do
      for round in 1 2; do
        "$bin/taper" bench step --model $model --device cuda --precision $p --steps 20 --compare-unfused
        python3 benches/torch_step.py --model $model --device cuda --precision $p --steps 20
      done
    done
  done
  "$bin/taper" bench step --model gpt2 --device cuda --precision bf16 --steps 20 --chunk 1024
}

run() {
  bin=/tmp/taper-gpu
  mkdir -p "$bin"
  for f in taper cuda_kernels; do
    xz -dc "$pack_dir/$f.xz" > "$bin/$f"
    chmod +x "$bin/$f"
  done
  local libs
  libs="$(cuda_libs 2>/dev/null || true)"
  [ -n "$libs" ] || echo "gpu-check: no nvidia/cu13/lib in python3's site-packages; relying on LD_LIBRARY_PATH" >&2
  export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  nvidia-smi -L || true
  local parts=("$@")
  [ ${#parts[@]} -gt 0 ] || parts=(tests drill bench)
  for part in "${parts[@]}"; do
    case "$part" in
      tests|drill|bench) "$part" ;;
      *) echo "gpu-check: unknown part $part (tests, drill, bench)" >&2; exit 2 ;;
    esac
  done
}

case "${1:-}" in
  pack) pack ;;
  run)
    shift
    if [ -n "${OUT:-}" ]; then
      run "$@" 2>&1 | tee "$OUT/gpu-check.log"
    else
      run "$@"
    fi
    ;;
  *) echo "usage: bash scripts/gpu-check.sh pack | run [tests] [drill] [bench]" >&2; exit 2 ;;
esac
