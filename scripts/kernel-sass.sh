#!/usr/bin/env bash
# What one of taper's CUDA kernel files becomes on an H100, without a GPU:
# compiled as build.rs compiles it (nvcc to PTX, no FMA contraction), then
# assembled for sm_90 by ptxas and disassembled by nvdisasm. Prints each
# kernel's registers and spills and its main loop's instruction counts
# (scripts/tools/sass_loops.py), the figures docs/performance.md quotes for
# the tiled attention. nvdisasm is not in the toolchain's wheels; its own
# wheel (PyPI, 13.5: the oldest 13.x there is 13.2) goes into .cuda/nvdisasm.
#
#   bash scripts/kernel-sass.sh kernels/flash.cu 'flash_forward_bf16_64$'
#   SASS_KEEP=/tmp/flash bash scripts/kernel-sass.sh kernels/flash.cu   # keep the .sass
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
src=${1:?usage: bash scripts/kernel-sass.sh kernels/FILE.cu [KERNEL_REGEX]}
eval "$(bash "$root/scripts/cuda-toolchain.sh")"
dir="${TAPER_CUDA_DIR:-$root/.cuda}"
nvdisasm="$dir/nvdisasm/nvidia/cu13/bin/nvdisasm"
if [ ! -x "$nvdisasm" ]; then
  echo "kernel-sass: installing nvdisasm into $dir/nvdisasm" >&2
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$dir/nvdisasm" \
    'nvidia-cuda-nvdisasm==13.5.37' >&2
  chmod +x "$nvdisasm"
fi
out=${SASS_KEEP:-$(mktemp -d)}
mkdir -p "$out"
nvcc --ptx -O3 -std=c++17 -I"$root/kernels" --fmad=false -arch=compute_90 "$src" -o "$out/k.ptx"
ptxas -v -arch=sm_90 "$out/k.ptx" -o "$out/k.cubin" 2> "$out/ptxas.log"
"$nvdisasm" -c "$out/k.cubin" > "$out/k.sass"
python3 "$root/scripts/tools/sass_loops.py" "$out/ptxas.log" "$out/k.sass" "${2:-.}"
[ -n "${SASS_KEEP:-}" ] || rm -rf "$out"
