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
# mamba_ssd_chunk_scan's alternative: the Mamba reference Triton kernels. mamba-ssm ships as an
# sdist whose build needs nvcc and whose top-level __init__ imports its compiled CUDA extension, so
# its Triton kernels are carried as a trimmed wheel: the sdist's mamba_ssm/ops/triton and
# mamba_ssm/utils files unchanged, with a top-level __init__ that imports nothing.
mamba_ver=2.3.2.post1
mamba_trimmed_wheel() {
  local tmp url src pkg
  tmp=$(mktemp -d)
  url=$(curl -sf https://pypi.org/pypi/mamba-ssm/json | python3 -c \
    "import json,sys; print([u['url'] for u in json.load(sys.stdin)['releases']['$mamba_ver'] if u['packagetype']=='sdist'][0])") \
    && curl -sfL "$url" | tar xz -C "$tmp" || return 1
  src="$tmp/mamba_ssm-$mamba_ver"; pkg="$tmp/trim/mamba_ssm"
  mkdir -p "$pkg/ops" && cp -r "$src/mamba_ssm/ops/triton" "$pkg/ops/" && cp -r "$src/mamba_ssm/utils" "$pkg/" || return 1
  touch "$pkg/ops/__init__.py"
  echo "__version__ = \"$mamba_ver\"  # Triton kernels only (trimmed: no compiled extension)" > "$pkg/__init__.py"
  cp "$src/LICENSE" "$tmp/trim/" 2>/dev/null
  printf '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n[project]\nname = "mamba-ssm"\nversion = "%s"\n[tool.setuptools.packages.find]\ninclude = ["mamba_ssm*"]\n' \
    "$mamba_ver" > "$tmp/trim/pyproject.toml"
  python3 -m pip wheel -q --no-deps --no-build-isolation -w .whl "$tmp/trim"; local rc=$?
  rm -rf "$tmp"; return $rc
}
mamba_trimmed_wheel \
  || echo "device-wheels: mamba-ssm's Triton kernels not available here; its alternative reports the missing package" >&2
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl packaging \
  || echo "device-wheels: packaging not available here" >&2
ls -1 .whl
