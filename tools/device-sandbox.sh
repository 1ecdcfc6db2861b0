#!/usr/bin/env bash
# Put bubblewrap and the shared libraries it links (not all of them are on the device image)
# into ./.sbx, an ignored folder that device calls carry (carry: [".sbx"]); tools/device-env.sh
# points D2K_BWRAP at it. Run once, here, where bubblewrap is installed (apt install bubblewrap).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
bin=$(command -v bwrap) || { echo "device-sandbox: bwrap not found (apt install bubblewrap)" >&2; exit 1; }
mkdir -p .sbx
cp "$bin" .sbx/bwrap
for lib in $(ldd "$bin" | awk '/=>/ {print $3}'); do
  case "$(basename "$lib")" in libc.so*|libm.so*|ld-linux*) ;; *) cp -L "$lib" .sbx/ ;; esac
done
ls -1 .sbx
