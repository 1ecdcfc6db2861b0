"""Per-kernel GPU times of a task's solutions (evidence for where a bar is missed).

For each requested (task, workload, solution): generate the workload's inputs, run the
solution a few times to compile and autotune, then record ``--calls`` calls under
``torch.profiler`` (CUDA activity only; a synchronize and a 2 ms pause between calls so that the
calls are separable on the device timeline). Per call it reports:

* every kernel the call launches, with its mean device time (us);
* ``busy``: the summed kernel time; ``span``: first kernel start to last kernel end on the
  device (span - busy = the gaps between dependent launches);
* ``SOL``: the workload's floor time under the task's floor work model at the measured H200
  ceilings (``d2kbench.scoring.sol``), and busy / span as % of it.

This is a diagnostic, not a benchmark: inputs are not refreshed between calls (the L2 may hold
part of them for small workloads) and there is no L2 flush. The benchmark numbers come from
``d2k bench``. The solution runs in this process (trusted code: the task's own solutions).

Usage (repo root, a GPU)::

    PYTHONPATH=src python3 devtools/kernel_profile.py TASK:WORKLOAD[,WORKLOAD...] [...]
        [-s expert] [--calls 20] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from d2kbench.checking.inputs import make_args  # noqa: E402
from d2kbench.scoring.sol import MEASURED, gpu_key, sol_ms  # noqa: E402
from d2kbench.tasks.loader import import_file, load_task  # noqa: E402

#: Gap (us) on the device timeline that separates two calls (the pause between calls is 2 ms).
CALL_GAP_US = 1000.0


def _calls(kernels: list[tuple[float, float, str]]) -> list[list[tuple[float, float, str]]]:
    """Split (start_us, end_us, name) kernel records, sorted by start, into calls."""
    calls: list[list] = []
    for k in kernels:
        if not calls or k[0] - max(e for _, e, _ in calls[-1]) > CALL_GAP_US:
            calls.append([])
        calls[-1].append(k)
    return calls


def profile_one(task, workload_id: str, solution: str, n_calls: int) -> dict:
    """Profile ``n_calls`` calls of one solution on one workload of ``task`` (a loaded task);
    returns the summary row.

    Raises:
        KeyError: unknown workload; FileNotFoundError: unknown solution; whatever the solution
        raises.
    """
    task_id = task.id
    wl = task.spec.workload(workload_id)
    ref = task.reference_module()
    mod = import_file(task.resolve_solution(solution, "cuda"), f"profiled_{task_id}_{solution}")
    args = make_args(ref, task.spec, wl, 1234, "cuda")
    for _ in range(3):  # compile, autotune, warm
        mod.run(*args)
    calls = profiled_calls(mod.run, args, n_calls)
    ceil = MEASURED.get(gpu_key(torch.cuda.get_device_name()) or "")
    sol_us = sol_ms(task.spec.sol.counts(task.spec.sol.floor), wl.axes, ceil)[0] * 1e3 if ceil else None
    return summary_row(task_id, workload_id, solution, calls, sol_us)


def profiled_calls(run, args: list, n_calls: int) -> list[list[tuple[float, float, str]]]:
    """``n_calls`` calls of ``run(*args)`` under the CUDA profiler, a synchronize and a 2 ms
    pause after each; per call its kernels as ``(start us, end us, name)`` in start order."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n_calls):
            run(*args)
            torch.cuda.synchronize()
            time.sleep(0.002)
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA)
    return [c for c in _calls(kernels) if c]


def summary_row(task_id: str, workload_id: str, solution: str, calls: list, sol_us: float | None) -> dict:
    """The table row of profiled ``calls``: kernels per call with their mean us, and the median
    busy time (summed kernel time) and span (first start to last end) in us."""
    per_name: dict[str, list[float]] = {}
    for c in calls:
        for s, e, name in c:
            per_name.setdefault(name, []).append(e - s)
    busy = sorted(sum(e - s for s, e, _ in c) for c in calls)
    span = sorted(max(e for _, e, _ in c) - min(s for s, _, _ in c) for c in calls)
    n = max(1, len(calls))
    return {
        "task": task_id, "workload": workload_id, "solution": solution, "calls": len(calls),
        "kernels": [(name, len(v) / n, sum(v) / len(v)) for name, v in per_name.items()],
        "busy_us": busy[len(busy) // 2] if busy else None,
        "span_us": span[len(span) // 2] if span else None,
        "sol_us": sol_us,
    }


def to_markdown(rows: list[dict]) -> str:
    """One table row per profiled call type, kernels listed as ``name x count: us``."""
    out = [f"# Per-kernel device times ({torch.cuda.get_device_name()}, torch {torch.__version__}, "
           f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
           "Medians over the profiled calls; busy = summed kernel time, span = first kernel start to last "
           "kernel end (span - busy = gaps between dependent launches). SOL: the task's floor model at the "
           "measured ceilings. Diagnostic only (no L2 flush, inputs not refreshed).", "",
           "| task | workload | solution | kernels per call (mean us each) | busy us | span us | SOL us | "
           "% SOL of span |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['task']} | {r['workload']} | {r['solution']} | error: {r['error']} | | | | |")
            continue
        ks = "; ".join(f"`{name[:48]}` x{cnt:g}: {us:.1f}" for name, cnt, us in r["kernels"])
        pct = f"{100 * r['sol_us'] / r['span_us']:.1f}" if r["sol_us"] and r["span_us"] else "-"
        out.append(f"| {r['task']} | {r['workload']} | {r['solution']} | {ks} | {r['busy_us']:.1f} | "
                   f"{r['span_us']:.1f} | {r['sol_us']:.2f} | {pct} |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("targets", nargs="+", help="TASK:WORKLOAD[,WORKLOAD...]")
    ap.add_argument("-s", "--solution", action="append", help="solution names (default: expert)")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--markdown", type=Path)
    a = ap.parse_args()
    rows = []
    for target in a.targets:
        task_id, _, wls = target.partition(":")
        task = load_task(task_id)
        for wl in wls.split(","):
            for sol in a.solution or ["expert"]:
                try:
                    rows.append(profile_one(task, wl, sol, a.calls))
                except Exception as e:  # noqa: BLE001 - report and go on with the next target
                    rows.append({"task": task_id, "workload": wl, "solution": sol, "error": f"{type(e).__name__}: {e}"[:200]})
                print(f"profiled {task_id} {wl} {sol}", file=sys.stderr, flush=True)
    page = to_markdown(rows)
    print(page)
    if a.markdown:
        a.markdown.write_text(page)


if __name__ == "__main__":
    main()
