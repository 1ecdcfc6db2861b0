"""H200 sweep of the lora_shrink_expand expert's tile configuration (self-contained script).

For each registered workload: the expert with its shape-chosen configuration
(``expert.config_for``) and one-at-a-time variations of it (row tile, shrink K step and split,
expand column block, warps, stages), plus the straightforward port; each checked once against
the reference (worst per-row relative error of y) and timed as a CUDA graph of back-to-back
calls alternating between two input sets (about 340 MB, several times the L2), the median of
10 replays divided by the calls. Prints microseconds per call and % of the SOL time at 4.3 TB/s
(the task's ``grouped_min`` bytes), and writes the rows as JSON with ``--out``.

Usage (repo root)::

    PYTHONPATH=src python3 devtools/lora_expert_gpu.py [--workloads ID,...] [--reps 10] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from d2kbench.tasks import load_task  # noqa: E402
from d2kbench.tasks.formula import evaluate_formula  # noqa: E402
from d2kbench.tasks.loader import import_file  # noqa: E402

HBM_TBS = 4.3


def _time_graph(fn, sets: list[dict], reps: int) -> float:
    """Median microseconds per call of ``fn`` over CUDA-graph replays of ``reps`` passes over ``sets``."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for a in sets:
            fn(a)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            for a in sets:
                fn(a)
    g.replay()
    torch.cuda.synchronize()
    out = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        out.append(e0.elapsed_time(e1) * 1e3 / (reps * len(sets)))
    return statistics.median(out)


def _row_error(ref, sol_run, a: dict) -> float:
    want = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in a.items()}
    got = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in a.items()}
    ref.run(**want)
    sol_run(got)
    d = (got["y"].float() - want["y"].float()).norm(dim=1) / want["y"].float().norm(dim=1)
    return float(d.max())


def _variants(cfg) -> list[tuple[str, object]]:
    out = [("default", cfg)]
    for field, values in (("bm", (16, 32, 64, 128)), ("bk", (32, 64, 128, 256)), ("split", (1, 2, 4, 8, 16, 32, 64)),
                          ("bn", (64, 128, 256)), ("warps_s", (2, 4, 8)), ("stages_s", (2, 3, 4, 5)),
                          ("warps_e", (2, 4, 8)), ("stages_e", (1, 2, 3))):
        for v in values:
            if getattr(cfg, field) != v:
                out.append((f"{field}={v}", dataclasses.replace(cfg, **{field: v})))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    task = load_task("lora_shrink_expand")
    ref = task.reference_module()
    ex = import_file(task.root / "solutions" / "expert.py", name="lora_expert_gpu")
    sf = import_file(task.root / "solutions" / "straightforward.py", name="lora_sf_gpu")
    wanted = [w for w in args.workloads.split(",") if w]
    rows = []
    for w in task.spec.workloads:
        if w.correctness_only or (wanted and w.id not in wanted):
            continue
        a = w.axes
        sol_us = evaluate_formula(task.spec.sol.variants["grouped_min"].bytes, a) / (HBM_TBS * 1e12) * 1e6
        sets = [ref.make_inputs(w.values(), seed, "cuda") for seed in (1, 2)]
        check = ref.make_inputs(w.values(), 3, "cuda")
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        cfg = ex.config_for(a["T"], a["K"], a["N"], a["R"], a["L"], a["S"], sms)
        print(f"== {w.id}: SOL {sol_us:.1f} us, default {cfg}", flush=True)
        cands = [(name, (lambda d, c=c: ex.lora_shrink_expand(**d, cfg=c))) for name, c in _variants(cfg)]
        cands.append(("straightforward", lambda d: sf.run(**d)))
        for name, fn in cands:
            try:
                err = _row_error(ref, fn, check)
                us = _time_graph(fn, sets, args.reps)
            except Exception as e:  # noqa: BLE001 - a variant that does not compile or launch is reported
                print(f"   {name:18s} FAILED {type(e).__name__}: {str(e)[:120]}", flush=True)
                continue
            rows.append({"workload": w.id, "variant": name, "us": us, "sol_pct": 100 * sol_us / us, "row_err": err})
            print(f"   {name:18s} {us:8.1f} us  {100 * sol_us / us:5.1f} % SOL  row err {err:.1e}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
