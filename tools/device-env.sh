# Source at the start of every device call (the H200 machine starts bare):
#   source tools/device-env.sh
# Installs the carried wheels (.whl, see tools/device-wheels.sh) into /tmp/site and puts
# them and this repo's src/ on PYTHONPATH; defines `d2k` as the CLI of this checkout.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH="/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
d2k() { python3 -m d2kbench.cli "$@"; }
# The OS sandbox of solution workers: bubblewrap carried with its libraries in ./.sbx
# (tools/device-sandbox.sh); refuse to evaluate without it.
if [ -x .sbx/bwrap ]; then export D2K_BWRAP="$PWD/.sbx/bwrap"; fi
export D2K_SANDBOX=require
