#!/usr/bin/env bash
# The CUDA 13.0 toolchain from PyPI wheels, for building taper's `cuda` feature
# on a machine without a GPU or a system CUDA (see ../shared/CUDA.md for why
# these pieces and versions). Installs into .cuda/ (git-ignored; set
# TAPER_CUDA_DIR to put it elsewhere), reuses it on later runs, and prints the
# environment as `export` lines:
#
#   eval "$(bash scripts/cuda-toolchain.sh)"
#   cargo build --release --features cuda
#
# Progress goes to stderr; stdout is only the export lines.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${TAPER_CUDA_DIR:-$root/.cuda}"
home="$dir/nvidia/cu13"
say() { echo "cuda-toolchain: $*" >&2; }

# 1. The wheels (about 644 MB to download, once).
if [ ! -x "$home/bin/nvcc" ] || [ ! -d "$home/nvvm" ]; then
  say "installing the CUDA 13.0 wheels into $dir"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$dir" \
    'nvidia-cuda-nvcc==13.0.*' 'nvidia-nvvm==13.0.*' 'nvidia-cuda-crt==13.0.*' \
    'nvidia-cuda-runtime==13.0.*' 'nvidia-cuda-cccl==13.0.*' 'nvidia-cuda-nvrtc==13.0.*' \
    'nvidia-cublas==13.0.2.14' 'nvidia-curand==10.4.0.35' >&2
fi
[ -x "$home/bin/nvcc" ] || { say "nvcc missing under $home/bin after install"; exit 1; }

# 1b. NCCL for the `nccl` feature (305 MB, once): the wheel torch depends on,
#     in a folder of its own (pip's --target does not add to an existing
#     `nvidia` package), linked below as libnccl.so.
nccl="$dir/nccl/nvidia/nccl"
if [ ! -e "$nccl/lib/libnccl.so.2" ]; then
  say "installing the NCCL wheel into $dir/nccl"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$dir/nccl" \
    'nvidia-nccl-cu13==2.32.*' >&2
fi
[ -e "$nccl/lib/libnccl.so.2" ] || { say "no libnccl.so.2 under $nccl/lib after install"; exit 1; }
ln -sf "$nccl/lib/libnccl.so.2" "$home/lib/libnccl.so"

# 2. Unversioned names, so that the linker's -l finds the libraries.
for name in cudart cublas cublasLt curand nvrtc; do
  if [ ! -e "$home/lib/lib$name.so" ]; then
    versioned="$(ls "$home/lib/lib$name.so."* 2>/dev/null | sort | head -n 1 || true)"
    [ -n "$versioned" ] || { say "no lib$name.so.* in $home/lib"; exit 1; }
    ln -sf "$(basename "$versioned")" "$home/lib/lib$name.so"
  fi
done

# 3. A link-time stub for the driver library (no wheel has libcuda.so): one
#    dummy function per cu* symbol that cudarc's driver bindings declare, with
#    the real library's soname, so that the binary asks for libcuda.so.1 from
#    the driver at run time.
stub="$home/lib/stubs/libcuda.so"
if [ ! -f "$stub" ]; then
  say "building a libcuda.so link stub from cudarc's driver bindings"
  (cd "$root" && cargo fetch --quiet >&2)
  cudarc="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-"$(
    awk '/^name = "cudarc"/ { getline; gsub(/[^0-9.]/, ""); print; exit }' "$root/Cargo.lock"
  )" 2>/dev/null | head -n 1 || true)"
  [ -d "$cudarc" ] || { say "cudarc sources not found (cargo fetch failed?)"; exit 1; }
  mkdir -p "$home/lib/stubs"
  grep -rhoE 'pub (unsafe )?fn cu[A-Z][A-Za-z0-9_]*' "$cudarc/src/driver/sys" \
    | sed -E 's/pub (unsafe )?fn //' | sort -u \
    | awk '{ printf "int %s(void) { return 999; }\n", $1 }' > "$home/lib/stubs/libcuda_stub.c"
  [ -s "$home/lib/stubs/libcuda_stub.c" ] || { say "no cu* symbols found in $cudarc"; exit 1; }
  cc -shared -fPIC -w -Wl,-soname,libcuda.so.1 "$home/lib/stubs/libcuda_stub.c" -o "$stub"
fi

cat <<EOF
export CUDA_HOME="$home"
export CUDA_PATH="$home"
export PATH="$home/bin:\$PATH"
export LIBRARY_PATH="$home/lib:$home/lib/stubs\${LIBRARY_PATH:+:\$LIBRARY_PATH}"
export CUDA_COMPUTE_CAP=90
export CUDARC_CUDA_VERSION=13000
EOF
