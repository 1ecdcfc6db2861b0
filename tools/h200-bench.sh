#!/usr/bin/env bash
# One d2k bench of a task on the H200 with the standard bars (expert >= straightforward per
# workload, the expert's bound-class bar), its GPU alternatives (minus those named in SKIP_ALTS)
# side by side; writes $OUT/tasks/<task>.{json,md,log} and appends to $OUT/d2k.sqlite.
#   bash tools/h200-bench.sh TASK [extra d2k bench options...]
set -uo pipefail
t=$1; shift
OUT=${OUT:-results/h200}
mkdir -p "$OUT/tasks"
alts=$(python3 -c "
import os
from d2kbench.tasks import load_task
skip = set(os.environ.get('SKIP_ALTS', '').split())
print(' '.join('-s alt:' + a.name for a in load_task('$t').spec.alternatives if 'cuda' in a.devices and a.name not in skip))")
echo "--- $t ($(date -u +%H:%M:%S)): expert straightforward $alts"
timeout "${TASK_TIMEOUT:-420}" python3 -m d2kbench.cli bench "$t" -s expert -s straightforward $alts --baseline reference \
  --device cuda --bar "expert/straightforward>=1.0" --bound-bar expert "$@" \
  --json "$OUT/tasks/$t.json" --markdown "$OUT/tasks/$t.md" --store "$OUT/d2k.sqlite" > "$OUT/tasks/$t.log" 2>&1
echo "bench $t rc=$?"; tail -n 30 "$OUT/tasks/$t.md" 2>/dev/null || tail -n 20 "$OUT/tasks/$t.log"
