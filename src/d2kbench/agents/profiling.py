"""``python -m d2kbench.agents.profiling --workspace DIR [--workload ID]``: profile the
workspace's ``solution.py`` on one workload (the ``profile`` tool runs this in a child process,
since the solution is untrusted).

Prints a ``torch.profiler`` table of the kernels / operators of a few calls after a warm-up
call, and, on a GPU where Nsight Compute (``ncu``) is installed, a per-kernel summary of a few
metrics (duration, SM throughput, DRAM throughput, achieved occupancy).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

NCU_METRICS = ("gpu__time_duration.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
               "dram__throughput.avg.pct_of_peak_sustained_elapsed", "sm__warps_active.avg.pct_of_peak_sustained_active")


def _setup(workspace: Path, workload: str | None):
    from d2kbench.agents.tools import load_task_of
    from d2kbench.agents.workspace import load_config
    from d2kbench.harness.evaluate import resolve_device

    cfg = load_config(workspace)
    task = load_task_of(cfg)
    device = resolve_device(cfg.device)
    if workload:
        wl = task.spec.workload(workload)
    else:
        pool = task.spec.workloads if device == "cuda" else task.spec.smoke_workloads
        wl = next((w for w in pool if not w.correctness_only), pool[0])
    return cfg, task, device, wl


def run_calls(workspace: Path, workload: str | None, calls: int, profile: bool) -> str:
    """Run the solution ``calls`` times after one warm-up call; the profiler table if asked."""
    import torch

    from d2kbench.harness.inputs import make_args, secret_seed
    from d2kbench.tasks.loader import import_file

    cfg, task, device, wl = _setup(workspace, workload)
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    sol = import_file(Path(workspace) / "solution.py")
    ref = task.reference_module()
    args = make_args(ref, task.spec, wl, secret_seed(), device)
    sol.run(*args)  # warm-up (compilation, autotuning)
    if device == "cuda":
        torch.cuda.synchronize()
    if not profile:
        for _ in range(calls):
            sol.run(*args)
        if device == "cuda":
            torch.cuda.synchronize()
        return ""
    from torch.profiler import ProfilerActivity, profile as tprofile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with tprofile(activities=acts) as prof:
        for _ in range(calls):
            sol.run(*args)
        if device == "cuda":
            torch.cuda.synchronize()
    sort = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=25, max_name_column_width=60)
    return (f"profile of solution.py on {wl.id} ({device}), {calls} calls after one warm-up call\n"
            f"{'(CPU: Triton interpreter; times are not GPU times)' if device == 'cpu' else ''}\n{table}")


def ncu_summary(workspace: Path, workload: str | None, timeout_s: float = 600.0) -> str:
    """Nsight Compute metrics of one call per kernel, or a line saying why there are none."""
    ncu = shutil.which("ncu")
    if not ncu:
        return "Nsight Compute: not available (ncu not found on PATH)."
    argv = [ncu, "--csv", "--target-processes", "all", "--metrics", ",".join(NCU_METRICS), sys.executable, "-m",
            "d2kbench.agents.profiling", "--workspace", str(workspace), "--calls", "1", "--no-profiler"]
    if workload:
        argv += ["--workload", workload]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"Nsight Compute: timed out after {timeout_s:.0f} s"
    if out.returncode != 0:
        return f"Nsight Compute failed (status {out.returncode}): {out.stderr[-800:]}"
    lines = [x for x in out.stdout.splitlines() if x.startswith('"')]
    return "Nsight Compute metrics (CSV, one row per kernel and metric):\n" + "\n".join(lines[:200])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m d2kbench.agents.profiling")
    ap.add_argument("--workspace", required=True)
    ap.add_argument("--workload", default=None)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--no-profiler", action="store_true", help="just run the calls (under ncu)")
    a = ap.parse_args(argv)
    ws = Path(a.workspace).resolve()
    try:
        text = run_calls(ws, a.workload, a.calls, profile=not a.no_profiler)
    except Exception as e:  # noqa: BLE001 - the solution's failure is the tool's answer
        print(f"profile: the solution failed: {type(e).__name__}: {e}")
        return 1
    if a.no_profiler:
        return 0
    print(text)
    _, _, device, _ = _setup(ws, a.workload)
    if device == "cuda":
        print(ncu_summary(ws, a.workload))
    else:
        print("Nsight Compute: not run (no GPU).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
