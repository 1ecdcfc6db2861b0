#!/usr/bin/env bash
# The H200 measurements committed under results/h200/, in one script (run on the device
# machine from the repo root; writes to $OUT). Then, here: copy the .json/.md files to
# results/h200/ and append the run's store to the committed one:
#   d2k results --store results/h200/d2k.sqlite --merge <files_at>/d2k.sqlite
#   part core:  d2k eval of the straightforward Muon solution vs the reference, twice
#               (harness overhead and repeatability)  -> muon_newton_schulz_straightforward.*
#   part muon:  d2k bench of expert and straightforward vs the reference with the bars
#               of the Muon expert issue             -> muon_newton_schulz.*
#   part evil:  the evil-solution suite on the GPU      -> evil.*
#   part evil_graph: its CUDA-graph cases only (graph_probe/*) -> evil_graph.*
#   part sandbox: what bubblewrap allows on the machine (devtools/sandbox_probe.py) and the
#               worker start-up with and without it (devtools/sandbox_startup.py) -> sandbox/*
#   part tasks: d2k bench of every other task: expert, straightforward and the task's GPU
#               alternatives (alt:NAME) vs the reference on all registered workloads, with the
#               performance bars of docs/timing.md (expert >= straightforward, the bound-class bar, prefill expert
#               >= SDPA flash)                         -> tasks/<task>.*
#               (one task only: TASKS="paged_decode_gqa" bash tools/h200-results.sh tasks;
#               PER_WORKLOAD=1 BASELINE=straightforward TASK_TIMEOUT=S: one bench per workload;
#               WORKLOADS="id id,id ...": one bench per listed group (ids joined by commas share a
#               bench) of the tasks that have all of its workloads)
# Usage: bash tools/h200-results.sh core muon evil tasks
set -uo pipefail
source tools/device-env.sh || exit 1
OUT=${OUT:-results/h200}
export COLUMNS=200
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
paper=(-w paper_32x2048x5464 -w paper_32x4096x11008 -w paper_8x7168x18432)
for part in "$@"; do
  echo "=== $part ($(date -u +%H:%M:%S))"
  case $part in
    core)
      d2k eval muon_newton_schulz straightforward --device cuda --baseline reference --repeat 2 "${paper[@]}" \
        --json "$OUT/muon_newton_schulz_straightforward.json" --markdown "$OUT/muon_newton_schulz_straightforward.md" \
        --store "$OUT/d2k.sqlite" | tail -n 40 ;;
    muon)
      d2k bench muon_newton_schulz -s expert -s straightforward --baseline reference --device cuda \
        --bar "expert/reference>=1.8" --bar "expert/straightforward>=1.5" \
        --json "$OUT/muon_newton_schulz.json" --markdown "$OUT/muon_newton_schulz.md" --store "$OUT/d2k.sqlite" \
        > /tmp/muon_bench.log 2>&1; echo "bench rc=$?"; tail -n 5 /tmp/muon_bench.log; cat "$OUT/muon_newton_schulz.md" ;;
    sandbox)
      mkdir -p "$OUT/sandbox"
      python3 devtools/sandbox_probe.py --bwrap "${D2K_BWRAP:-bwrap}" --out "$OUT/sandbox/sandbox_probe.json" | tail -n 12
      python3 devtools/sandbox_startup.py --device cuda --n 5 --out "$OUT/sandbox" | tail -n 8 ;;
    evil)
      timeout 300 python3 -m d2kbench.cli evil --device cuda --jobs 8 --json "$OUT/evil.json" --markdown "$OUT/evil.md" > /tmp/evil.log 2>&1; echo "evil rc=$?"; tail -n 60 "$OUT/evil.md" ;;
    evil_graph)
      timeout 120 python3 -m d2kbench.cli evil --device cuda -k graph_probe --json "$OUT/evil_graph.json" --markdown "$OUT/evil_graph.md" > /tmp/evil_graph.log 2>&1; echo "evil_graph rc=$?"; tail -n 8 "$OUT/evil_graph.md" ;;
    tasks)
      mkdir -p "$OUT/tasks"
      for t in ${TASKS:-$(python3 -c "from d2kbench.tasks import list_tasks; print(' '.join(t for t in list_tasks() if t != 'muon_newton_schulz'))")}; do
        alts=$(python3 -c "from d2kbench.tasks import load_task; print(' '.join('-s alt:' + a.name for a in load_task('$t').spec.alternatives if 'cuda' in a.devices))")
        extra=()
        [ "$t" = gqa_flash_prefill ] && extra=(--bar "expert/alt:sdpa_flash>=1.0")
        # PER_WORKLOAD=1: one bench per registered workload (tasks/<task>__<workload>.*), so a task
        # whose reference is a slow token loop keeps what it measured when a later workload runs out
        # of time. BASELINE: the timed baseline (default reference; straightforward spares timing
        # such a reference, which still computes every expected value).
        if [ -n "${WORKLOADS:-}" ]; then  # only these workloads (ids of this task), one bench each
          groups=$(python3 -c "from d2kbench.tasks import load_task; ids={w.id for w in load_task('$t').spec.workloads}; print(' '.join(g for g in '$WORKLOADS'.split() if set(g.split(',')) <= ids))")
        elif [ "${PER_WORKLOAD:-0}" = 1 ]; then
          groups=$(python3 -c "from d2kbench.tasks import load_task; print(' '.join(w.id for w in load_task('$t').spec.workloads if not w.id.startswith('smoke')))")
        else
          groups=all
        fi
        for g in $groups; do
          name=$t; sel=()
          if [ "$g" != all ]; then name="${t}__${g//,/+}"; for w in ${g//,/ }; do sel+=(-w "$w"); done; fi
          echo "--- $name ($(date -u +%H:%M:%S)): expert straightforward $alts vs ${BASELINE:-reference}"
          sols=(-s expert -s straightforward); [ "${BASELINE:-reference}" = straightforward ] && sols=(-s expert)
          timeout "${TASK_TIMEOUT:-420}" python3 -m d2kbench.cli bench "$t" "${sel[@]}" "${sols[@]}" $alts \
            --baseline "${BASELINE:-reference}" --device cuda --bar "expert/straightforward>=1.0" --bound-bar expert "${extra[@]}" \
            --json "$OUT/tasks/$name.json" --markdown "$OUT/tasks/$name.md" --store "$OUT/d2k.sqlite" > "/tmp/bench_$name.log" 2>&1
          echo "bench $name rc=$? ($(date -u +%H:%M:%S))"; tail -n 3 "/tmp/bench_$name.log"
        done
      done ;;
    *) echo "unknown part $part" ;;
  esac
done
echo "=== done ($(date -u +%H:%M:%S))"
