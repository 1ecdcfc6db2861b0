"""Measure what the OS sandbox adds to a solution worker's start-up: the parent's wall time from
spawning a worker to its ``ready`` (Python and torch imported, CUDA initialised, the task and
the solution imported), with bubblewrap and with ``D2K_SANDBOX=off``, alternating, best and
median of ``--n`` starts each. On the CPU also bubblewrap with ``D2K_WORKER_START=exec``: a
sandboxed worker started as a fresh interpreter instead of forked by the fork server
(``d2kbench.harness.forkserver``); the first sandboxed start, which also starts the server, is
reported on its own.

    PYTHONPATH=src python devtools/sandbox_startup.py --device cuda --n 5 --out results/h200/sandbox

Writes ``sandbox_startup.json`` and ``sandbox_startup.md`` (with the machine's GPU, driver,
torch and triton versions and the date) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

#: The configurations: (name, D2K_SANDBOX, D2K_WORKER_START, label).
CONFIGS = (("require", "require", "auto", None), ("require_exec", "require", "exec", "bwrap, D2K_WORKER_START=exec"),
           ("off", "off", "auto", "none (D2K_SANDBOX=off)"))


def one_start(task, solution: Path, device: str, mode: str, start: str = "auto") -> tuple[float, dict]:
    from d2kbench.harness.process import WorkerHandle
    from d2kbench.sandbox import bwrap

    os.environ["D2K_SANDBOX"] = mode
    os.environ["D2K_WORKER_START"] = start
    bwrap._status_cached.cache_clear()
    h = WorkerHandle(task.root, solution, device, 300, {"trusted": True})
    t0 = time.perf_counter()
    h.start()
    wall = time.perf_counter() - t0
    info = {"sandbox": h.sandbox, "worker": h.startup_s}
    h.close()
    return wall, info


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--out", default="results/h200/sandbox")
    a = ap.parse_args()
    from d2kbench.harness.env import fingerprint
    from d2kbench.tasks import load_task

    task = load_task("muon_newton_schulz")
    sol = task.root / "reference.py"
    configs = [c for c in CONFIGS if c[0] != "require_exec" or a.device == "cpu"]  # the GPU always execs
    walls: dict[str, list[float]] = {c[0]: [] for c in configs}
    infos: dict[str, dict] = {}
    one_start(task, sol, a.device, "off")  # warm the file cache: the first start reads torch from disk
    first_s, _ = one_start(task, sol, a.device, "require")  # on the CPU: also starts the fork server
    for _ in range(a.n):
        for name, mode, start, _label in configs:
            w, info = one_start(task, sol, a.device, mode, start)
            walls[name].append(w)
            infos[name] = info
    env = fingerprint(a.device)
    res = {"device": a.device, "n": a.n, "walls_s": walls, "last": infos,
           "median_s": {m: statistics.median(v) for m, v in walls.items()},
           "best_s": {m: min(v) for m, v in walls.items()},
           "extra_median_s": statistics.median(walls["require"]) - statistics.median(walls["off"]),
           "first_require_s": first_s,
           "env": {k: env.get(k) for k in ("gpu", "driver", "torch", "triton", "time_utc", "host")}}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sandbox_startup.json").write_text(json.dumps(res, indent=1))
    e = res["env"]
    md = [f"# Worker start-up with and without the OS sandbox ({a.device})", "",
          f"{e.get('gpu') or 'CPU'}, driver {e.get('driver')}, torch {e.get('torch')}, triton {e.get('triton')}, "
          f"{e.get('time_utc')}; {a.n} starts each, alternating; spawn to ready (s)", "",
          "| sandbox | best | median | all |", "|---|---|---|---|"]
    for name, _mode, _start, label in configs:
        md.append(f"| {label or infos[name]['sandbox']} | {res['best_s'][name]:.3f} | {res['median_s'][name]:.3f} | "
                  + ", ".join(f"{w:.3f}" for w in walls[name]) + " |")
    md += ["", f"Extra start-up of a sandboxed worker (median difference): {res['extra_median_s']:.3f} s",
           f"First sandboxed start of the process (on the CPU it also starts the fork server): {first_s:.3f} s"]
    (out / "sandbox_startup.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
