#!/usr/bin/env bash
# The GPU checks of the CUDA path, for a session that is lent a GPU machine
# (which has the driver, python3 with torch and its CUDA 13 libraries, but no
# cargo and no network). Two halves:
#
#   bash scripts/gpu-check.sh pack          # here: build the CUDA binary, the
#                                           # NCCL one and the GPU tests, xz them
#                                           # into .gpu/
#   bash scripts/gpu-check.sh pack-base REV # here: REV's CUDA binary, as the
#                                           # baseline for `run compare`
#   bash scripts/gpu-check.sh run [PARTS]   # on the GPU machine, with .gpu
#                                           # carried; PARTS of: first tests drill
#                                           # bench nccl profile products compare
#                                           # attention (default: tests drill
#                                           # bench nccl). With 15 minutes of
#                                           # device time: `run first`, alone.
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
  # The NCCL build (it links libnccl.so.2: a binary of its own, so that the
  # checks above run where NCCL is missing).
  cargo build --release --features nccl --target-dir target/cuda -p taper
  strip -o "$pack_dir/taper-nccl" target/cuda/release/taper
  xz -T0 -6 -f "$pack_dir/taper-nccl"
  ls -la "$pack_dir"
}

# A baseline to measure a change against: the CUDA binary of another
# revision (the commit before the change), built from a git worktree in
# target/base-src into .gpu/taper-base.xz; `run compare` alternates it with
# .gpu/taper in one job. It has a target folder of its own: in this tree's,
# cargo takes the worktree's build for fresh (the fingerprints name this
# tree's files) and hands back this tree's binary. The first build there
# takes as long as a clean one.
pack_base() {
  local rev="${1:?usage: bash scripts/gpu-check.sh pack-base REV}"
  eval "$(bash scripts/cuda-toolchain.sh)"
  local src="$root/target/base-src"
  git worktree remove --force "$src" 2>/dev/null || rm -rf "$src"
  git worktree prune
  git worktree add --detach "$src" "$rev"
  (cd "$src" && cargo build --release --features cuda --target-dir "$root/target/cuda-base" -p taper)
  mkdir -p "$pack_dir"
  strip -o "$pack_dir/taper-base" target/cuda-base/release/taper
  xz -T0 -6 -f "$pack_dir/taper-base"
  git worktree remove --force "$src"
  echo "gpu-check: .gpu/taper-base.xz is $(git rev-parse --short "$rev")" >&2
}

# On the GPU machine: torch's CUDA 13 libraries (cudart, cublas, curand),
# and its NCCL.
cuda_libs() {
  python3 - <<'PY'
import os, nvidia
found = []
for sub in (("cu13", "lib"), ("nccl", "lib")):
    for base in nvidia.__path__:
        lib = os.path.join(base, *sub)
        if os.path.isdir(lib):
            found.append(lib)
            break
print(":".join(found))
PY
}

# NCCL through the data-parallel path with a world of one: the same digits
# run with and without --collective nccl, and their weights compared (the
# sum over one rank changes nothing).
nccl() {
  echo "== NCCL, world size 1"
  rm -rf /tmp/nccl-plain /tmp/nccl-one
  timeout 120 "$bin/taper-nccl" train scripts/digits.lua --device cuda --set epochs=3 --quiet \
    --out /tmp/nccl-plain || echo "plain exit $?"
  timeout 120 "$bin/taper-nccl" train scripts/digits.lua --device cuda --set epochs=3 \
    --collective nccl --out /tmp/nccl-one 2>&1 | tail -4 || echo "nccl exit $?"
  python3 - /tmp/nccl-plain /tmp/nccl-one <<'PY' || true
import json, struct, sys
import torch

def load(path):
    # safetensors by hand (the GPU machine has torch, maybe not safetensors).
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n])
    out = {}
    for k, v in head.items():
        if k.startswith("model.") and v["dtype"] == "F32":
            a, b = v["data_offsets"]
            out[k] = torch.frombuffer(bytearray(raw[8 + n + a:8 + n + b]), dtype=torch.float32)
    return out

a, b = (load(f"{d}/checkpoint.safetensors") for d in sys.argv[1:3])
worst = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
run = [json.loads(l) for l in open(f"{sys.argv[2]}/metrics.jsonl") if '"event":"run"' in l]
print(f"  collective: {run[0].get('collective') if run else None}; max weight difference {worst:.3g}")
PY
}

tests() {
  echo "== no GPU visible: the CUDA build must fail in one line"
  set +e
  CUDA_VISIBLE_DEVICES= "$bin/taper" train scripts/digits.lua --device cuda --quiet
  echo "exit $?"
  set -e
  echo "== kernels against their CPU references, AdamW, digits on the GPU"
  # Each step is bounded and a failure does not stop the next: a device
  # call is short and every answer counts.
  gpu_tests 300 timeout
  echo "== the main job on the GPU"
  for p in f32 bf16; do
    (time timeout 120 "$bin/taper" train scripts/digits.lua --device cuda --set precision=$p \
      --out /tmp/digits-$p) 2>&1 | tail -8 || echo "digits $p failed"
  done
}

# The GPU tests in three processes: the tiled attention's (whose 32-row
# kernels have never run on a GPU) and cuBLASLt's apart from the rest. A
# kernel that faults leaves its process's CUDA context unusable, and every
# later test of that process would fail with it. gpu_tests LIMIT RUNNER:
# RUNNER is timeout or within; the rest gets LIMIT seconds.
gpu_tests() {
  local limit=$1 runner=$2
  "$runner" "$limit" "$bin/cuda_kernels" --test-threads=1 --skip flash_attention --skip cublaslt \
    || echo "cuda_kernels exit $?"
  "$runner" 120 "$bin/cuda_kernels" --test-threads=1 flash_attention || echo "cuda_kernels (flash) exit $?"
  "$runner" 60 "$bin/cuda_kernels" --test-threads=1 cublaslt || echo "cuda_kernels (cuBLASLt) exit $?"
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
    timeout 150 "$bin/taper" train scripts/shakespeare.lua --device cuda --quiet --out "$out" \
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
  drill_eval
}

# A real CUDA OOM in evaluation: a small training batch and the whole held-out
# split as one evaluation batch. Unconstrained first, for the training and the
# evaluation peaks (epoch and eval records); then --mem-limit halfway between
# them, so that training fits and evaluation does not: the evaluation batch is
# split (oom records with phase eval, cause device) and scores the same.
drill_eval() {
  local set=(--set steps=20 --set sample=0 --set epochs=1 --set width=512 --set layers=6
             --set heads=8 --set context=256 --set batch=8 --set val_windows=100000
             --set val_batch=100000)
  local free=/tmp/drill-eval-free tight=/tmp/drill-eval-tight
  rm -rf "$free" "$tight"
  echo "== evaluation drill, unconstrained"
  timeout 150 "$bin/taper" train scripts/shakespeare.lua --device cuda --quiet --out "$free" "${set[@]}" \
    || { echo "gpu-check: the unconstrained evaluation drill failed" >&2; return 1; }
  local limit
  limit="$(python3 - "$free/metrics.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
train = max(r.get("device_memory_peak") or 0 for r in recs if r["event"] == "epoch")
ev = max(r.get("device_memory_peak") or 0 for r in recs if r["event"] == "eval")
print(f"training peak {train}, evaluation peak {ev}", file=sys.stderr)
print(int((train + ev) / 2) if ev > 1.1 * train else "")
PY
)"
  [ -n "$limit" ] || { echo "gpu-check: evaluation does not peak above training; raise val_batch" >&2; return 1; }
  echo "== evaluation drill, --mem-limit $limit"
  set +e
  timeout 150 "$bin/taper" train scripts/shakespeare.lua --device cuda --quiet --out "$tight" \
    "${set[@]}" --mem-limit "$limit"
  echo "exit $?"
  set -e
  python3 - "$free/metrics.jsonl" "$tight/metrics.jsonl" <<'PY' || true
import json, sys
free, tight = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
pick = lambda recs, e: [r for r in recs if r["event"] == e]
ooms = pick(tight, "oom")
print(f"  {len(ooms)} OOMs: " + ", ".join(f"{r['phase']}/{r['cause']}/{r['action']}->{r['new_micro_batch']}" for r in ooms))
a, b = pick(free, "eval")[-1], pick(tight, "eval")[-1]
print(f"  eval loss {a['loss']} unconstrained, {b['loss']} under the limit; accuracy {a['accuracy']} / {b['accuracy']}")
PY
}

# taper against PyTorch at its best (SDPA, fused AdamW; for GPT-2 also
# torch.compile, a labelled variant), alternating in rounds, then a table of
# medians and ratios (benches/ratios.py; MFU against the card's 989 TFLOP/s
# dense bf16 as well). GPT-2 small runs at each of BENCH_BATCHES (context
# 1024). The defaults take about 7 minutes: split a run with BENCH_MODELS.
# BENCH_UNFUSED=1 adds taper with its fused kernels off; BENCH_MANUAL=1 the
# hand-written attention (the old reference) for GPT-2; at GPT-2's first batch
# size taper also runs with --recompute 1 and with --offload (BENCH_MEMORY=0:
# not). Language models in f16/bf16 also run with the other attention path
# (`fused,cublas-attention` beside the default `fused,flash`; BENCH_FLASH=0:
# not).
bench() {
  local log=/tmp/bench.log
  : > "$log"
  local model p b round
  for model in ${BENCH_MODELS:-shakespeare cnn lenet gpt2}; do
    local precisions="${BENCH_PRECISIONS:-f32 bf16}" batches=default
    if [ "$model" = gpt2 ]; then
      precisions="${BENCH_GPT2_PRECISIONS:-bf16}"
      batches="${BENCH_BATCHES:-8 16 32}"
    fi
    for p in $precisions; do
      for b in $batches; do
        local size=()
        [ "$b" = default ] || size=(--batch "$b")
        local extra=()
        [ "${BENCH_UNFUSED:-0}" = 1 ] && extra=(--compare-unfused)
        [ "${BENCH_FLASH:-1}" = 1 ] && [ "$p" != f32 ] && [ "${model#cnn}" = "$model" ] && extra+=(--compare-attention)
        for round in $(seq "${BENCH_ROUNDS:-2}"); do
          echo "== bench $model $p batch $b"
          timeout 150 "$bin/taper" bench step --model "$model" --device cuda --precision "$p" \
            --steps 20 "${size[@]}" "${extra[@]}" || echo "taper bench exit $?"
          timeout 100 python3 benches/torch_step.py --model "$model" --device cuda --precision "$p" \
            --steps 20 "${size[@]}" || echo "torch bench exit $?"
          if [ "$model" = gpt2 ] && [ "${BENCH_COMPILE:-1}" = 1 ]; then
            timeout 240 python3 benches/torch_step.py --model "$model" --device cuda --precision "$p" \
              --steps 20 "${size[@]}" --compile || echo "torch compile bench exit $?"
          fi
          # Issue 19's memory actions on the device: the pool peak and the
          # time with every block recomputed, and with AdamW's moments in
          # pinned host memory.
          if [ "$model" = gpt2 ] && [ "$b" = "${batches%% *}" ] && [ "${BENCH_MEMORY:-1}" = 1 ]; then
            for action in "--recompute 1" "--offload"; do
              # shellcheck disable=SC2086
              timeout 150 "$bin/taper" bench step --model "$model" --device cuda --precision "$p" \
                --steps 20 "${size[@]}" $action || echo "taper bench $action exit $?"
            done
          fi
          if [ "$model" = gpt2 ] && [ "${BENCH_MANUAL:-0}" = 1 ]; then
            timeout 100 python3 benches/torch_step.py --model "$model" --device cuda --precision "$p" \
              --steps 20 "${size[@]}" --attention manual || echo "torch manual bench exit $?"
          fi
        done
      done
    done
  done 2>&1 | tee -a "$log"
  python3 benches/ratios.py "$log" --card-peak-tflops 989 || true
  [ -n "${OUT:-}" ] && cp "$log" "$OUT/bench.log"
  return 0
}

# The GPT-2 step of .gpu/taper-base (see pack-base) and of .gpu/taper
# (with cuBLASLt's dense forward off, the default, and on), alternating in
# rounds in one job, at each of COMPARE_BATCHES (default 8): what a change
# bought, on one machine.
compare() {
  [ -x "$bin/taper-base" ] || { echo "gpu-check: no taper-base (bash scripts/gpu-check.sh pack-base REV)" >&2; return 1; }
  local b round which
  for b in ${COMPARE_BATCHES:-8}; do
    for round in $(seq "${BENCH_ROUNDS:-2}"); do
      for which in taper-base taper taper+cublaslt; do
        echo "== $which gpt2 bf16 batch $b (round $round)"
        # taper+cublaslt: this tree's binary with TAPER_CUBLASLT=1.
        TAPER_CUBLASLT=$([ "$which" = taper+cublaslt ] && echo 1 || echo 0) \
          timeout 150 "$bin/${which%+cublaslt}" bench step --model gpt2 --device cuda \
          --precision bf16 --steps 20 --batch "$b" || echo "$which exit $?"
      done
    done
  done
}

# The tiled attention's share of a GPT-2 step: the same 8192 tokens a step
# at context 64 (where attention costs little) and at 1024, each with the
# tiled kernel and with cuBLAS products over the scores (--compare-attention),
# for .gpu/taper-base when it is packed and for .gpu/taper, alternating in
# rounds. The difference between the two contexts is the attention's time;
# between the binaries, what a change to kernels/flash.cu bought.
attention() {
  local round which ctx bins=(taper)
  [ -x "$bin/taper-base" ] && bins=(taper-base taper)
  for round in $(seq "${BENCH_ROUNDS:-2}"); do
    for which in "${bins[@]}"; do
      for ctx in ${ATTENTION_CONTEXTS:-64 1024}; do
        echo "== $which gpt2 bf16 context $ctx batch $((8192 / ctx)) (round $round)"
        timeout 150 "$bin/$which" bench step --model gpt2 --device cuda --precision bf16 \
          --steps 20 --context "$ctx" --batch $((8192 / ctx)) --compare-attention \
          || echo "$which exit $?"
      done
    done
  done
}

# The products of a GPT-2 small step alone (`taper bench products`, and
# benches/torch_products.py for PyTorch's), alternating in rounds: how fast
# the products run in each, apart from the element-wise work around them;
# then taper's element-wise kernels alone, with the rate each moves memory
# (`taper bench elementwise`).
products() {
  local round
  for round in $(seq "${BENCH_ROUNDS:-2}"); do
    echo "== products, round $round"
    timeout 120 "$bin/taper" bench products --device cuda --precision bf16 || echo "taper products exit $?"
    TAPER_CUBLASLT=1 timeout 120 "$bin/taper" bench products --device cuda --precision bf16 \
      || echo "taper (cuBLASLt) products exit $?"
    timeout 120 "$bin/taper" bench elementwise --device cuda --precision bf16 \
      || echo "taper elementwise exit $?"
    timeout 120 python3 benches/torch_products.py --device cuda --precision bf16 || echo "torch products exit $?"
  done
}

# Where a GPT-2 step's device time goes: every kernel of `taper bench step`
# (3 warm-up steps, 1 timed, and the 8 matmuls of the ceiling) under Nsight
# Compute, summed by name; then the same step in PyTorch's profiler.
profile() {
  local args=(bench step --model gpt2 --device cuda --precision "${PROFILE_PRECISION:-bf16}"
              --steps 1 --chunk "${PROFILE_CHUNK:-1024}" --no-weights-check)
  echo "== kernels of taper ${args[*]} (ncu; 4 steps)"
  timeout 420 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum \
    --csv --page raw "$bin/taper" "${args[@]}" > /tmp/ncu.csv 2> /tmp/ncu.err \
    || { echo "ncu exit $?"; tail -5 /tmp/ncu.err; }
  [ -n "${OUT:-}" ] && xz -T0 -c /tmp/ncu.csv > "$OUT/ncu.csv.xz"
  python3 - /tmp/ncu.csv <<'PY' || true
import csv, sys, collections
rows = [l for l in open(sys.argv[1]) if l.startswith('"')]
recs = list(csv.DictReader(rows))[1:]  # the second row holds the units
tot, cnt = collections.Counter(), collections.Counter()
for r in recs:
    name = r["Kernel Name"][:90]
    tot[name] += float(r["gpu__time_duration.sum"].replace(",", ""))
    cnt[name] += 1
all_ns = sum(tot.values())
print(f"{len(recs)} kernels, {all_ns / 4e6:.1f} ms of device time per step")
for name, ns in tot.most_common(30):
    print(f"{ns / 4e6:8.2f} ms/step {100 * ns / all_ns:5.1f}% {cnt[name] / 4:7.1f}x/step  {name}")
PY
  [ "${PROFILE_TORCH:-1}" = 1 ] || return 0
  echo "== the same step in PyTorch"
  timeout 120 python3 benches/torch_step.py --model gpt2 --device cuda \
    --precision "${PROFILE_PRECISION:-bf16}" --steps 3 --profile || echo "torch profile exit $?"
}

# The one call a session makes when its task has about 15 minutes of device
# time in all (a fresh machine takes one or two of them to start): the checks
# in order of what a later session needs most, each bounded by what is left of
# FIRST_BUDGET_S (default 480 s; under 20 s left, a step is skipped and says
# so). 1. every GPU test; 2. the GPT-2 bf16 step at batch 8 in rounds: this
# tree, this tree with the tiled attention's warps of 32 rows
# (TAPER_FLASH_ROWS=32), .gpu/taper-base (pack-base), this tree with cuBLASLt's dense forward,
# PyTorch eager with SDPA and fused AdamW, and once this tree with the command
# on the main thread; 3. taper's element-wise kernels against the card's memory
# bandwidth; 4. the products alone, both sides; 5. the attention's share (the
# step at context 64 and 1024, this tree with 16 and 32 rows a warp, and the
# base); 6. torch.compile at
# batch 8. Then benches/ratios.py's table of step 2. `run profile` (Nsight
# Compute, about 7 minutes) needs a call of its own.
first() {
  local end=$((SECONDS + ${FIRST_BUDGET_S:-480}))
  local log=/tmp/first.log
  : > "$log"
  {
    echo "== 1. the GPU tests"
    gpu_tests 200 within
    local b=${FIRST_BATCH:-8} round
    local step=(bench step --model gpt2 --device cuda --precision bf16 --steps 20 --batch "$b")
    for round in $(seq "${BENCH_ROUNDS:-2}"); do
      echo "== bench gpt2 bf16 batch $b"
      within 90 env TAPER_CUBLASLT=0 "$bin/taper" "${step[@]}"
      within 90 env TAPER_CUBLASLT=0 TAPER_FLASH_ROWS=32 "$bin/taper" "${step[@]}" | tagged r32
      if [ -x "$bin/taper-base" ]; then
        within 90 env TAPER_CUBLASLT=0 "$bin/taper-base" "${step[@]}" | tagged base
      fi
      within 90 env TAPER_CUBLASLT=1 "$bin/taper" "${step[@]}" | tagged cublaslt
      within 100 python3 benches/torch_step.py --model gpt2 --device cuda --precision bf16 \
        --steps 20 --batch "$b"
      if [ "$round" = 1 ]; then
        within 90 env TAPER_CPU_WORKERS=0 "$bin/taper" "${step[@]}" | tagged main-thread
      fi
    done
    echo "== 3. element-wise kernels"
    within 90 "$bin/taper" bench elementwise --device cuda --precision bf16
    echo "== 4. the products alone"
    within 90 "$bin/taper" bench products --device cuda --precision bf16
    within 90 env TAPER_CUBLASLT=1 "$bin/taper" bench products --device cuda --precision bf16
    within 90 python3 benches/torch_products.py --device cuda --precision bf16
    echo "== 5. the attention's share (8192 tokens a step)"
    local ctx
    for ctx in 64 1024; do
      local at=(bench step --model gpt2 --device cuda --precision bf16 --steps 20
                --context "$ctx" --batch $((8192 / ctx)) --compare-attention)
      echo "== bench gpt2@context$ctx bf16 batch $((8192 / ctx))"
      within 90 "$bin/taper" "${at[@]}"
      within 90 env TAPER_FLASH_ROWS=32 "$bin/taper" "${at[@]}" | tagged r32
      if [ -x "$bin/taper-base" ]; then
        within 90 "$bin/taper-base" "${at[@]}" | tagged base
      fi
    done
    echo "== bench gpt2 bf16 batch $b"
    within 240 python3 benches/torch_step.py --model gpt2 --device cuda --precision bf16 \
      --steps 20 --batch "$b" --compile
  } 2>&1 | tee -a "$log"
  python3 benches/ratios.py "$log" --card-peak-tflops 989 || true
  echo "gpu-check: first took ${SECONDS}s"
  [ -n "${OUT:-}" ] && cp "$log" "$OUT/first.log"
  return 0
}

# within LIMIT CMD...: CMD under LIMIT seconds or what is left of first's
# budget ($end), whichever is less; skipped when under 20 s are left. A
# failure is reported and does not stop the next step.
within() {
  local limit=$1 left=$((end - SECONDS))
  shift
  if [ "$left" -lt 20 ]; then
    echo "gpu-check: skipped (${left}s of the budget left): $*"
    return 0
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  timeout "$limit" "$@" || echo "gpu-check: exit $? from $*"
}

# Marks the step lines of a variant (`... fused: 30.2 ms/step` becomes
# `... fused[base]: ...`), so benches/ratios.py gives it a row of its own.
tagged() {
  sed -u -E "s/^(step .* (un)?fused[^ :]*):/\1[$1]:/"
}

run() {
  bin=/tmp/taper-gpu
  mkdir -p "$bin"
  for f in taper cuda_kernels taper-nccl taper-base; do
    [ -e "$pack_dir/$f.xz" ] || { [ "$f" = taper-base ] || echo "gpu-check: no $f in $pack_dir" >&2; continue; }
    xz -dc "$pack_dir/$f.xz" > "$bin/$f"
    chmod +x "$bin/$f"
  done
  local libs
  libs="$(cuda_libs 2>/dev/null || true)"
  [ -n "$libs" ] || echo "gpu-check: no nvidia/cu13/lib in python3's site-packages; relying on LD_LIBRARY_PATH" >&2
  export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  nvidia-smi -L || true
  local parts=("$@")
  [ ${#parts[@]} -gt 0 ] || parts=(tests drill bench nccl)
  for part in "${parts[@]}"; do
    case "$part" in
      tests|drill|bench|nccl|profile|products|compare|attention|first) "$part" ;;
      *) echo "gpu-check: unknown part $part (first, tests, drill, bench, nccl, profile, products, compare, attention)" >&2; exit 2 ;;
    esac
  done
}

case "${1:-}" in
  pack) pack ;;
  pack-base) shift; pack_base "$@" ;;
  run)
    shift
    if [ -n "${OUT:-}" ]; then
      run "$@" 2>&1 | tee "$OUT/gpu-check.log"
    else
      run "$@"
    fi
    ;;
  *) echo "usage: bash scripts/gpu-check.sh pack | pack-base REV | run [first] [tests] [drill] [bench] [nccl] [profile] [products] [compare] [attention]" >&2; exit 2 ;;
esac
