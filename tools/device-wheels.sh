#!/usr/bin/env bash
# Download the wheels the H200 device machine lacks (it has torch, triton, numpy, rich, typer,
# pyyaml but no pydantic) into ./.whl for Python 3.12 / manylinux x86_64. Run once, here.
# Each device call then starts with: source tools/device-env.sh
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
pyver=$(python3 -c 'import pydantic, pydantic_core; print(pydantic.VERSION, pydantic_core.__version__)' 2>/dev/null || echo "")
pkgs=(pydantic pydantic-core annotated-types typing-inspection typing-extensions)
if [ -n "$pyver" ]; then
  read -r pd pc <<<"$pyver"
  pkgs=("pydantic==$pd" "pydantic-core==$pc" annotated-types typing-inspection typing-extensions)
fi
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  plat+=(--platform "$p")
done
for pkg in "${pkgs[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${plat[@]}" -d .whl "$pkg"
done
# The pure-Python/Triton packages of the task alternatives that run on the GPU (fla-core for
# gated_deltanet_chunk_prefill, liger-kernel for fused_linear_cross_entropy); ~2 MB together.
for pkg in fla-core einops liger-kernel; do
  python3 -m pip download -q --no-deps --only-binary=:all: -d .whl "$pkg" \
    || echo "device-wheels: $pkg not available here; its alternative reports the missing package" >&2
done
ls -1 .whl
