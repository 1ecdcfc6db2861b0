"""``python -m d2kbench.agents.profiling --task T --solution FILE --device D [--workload ID]``:
profile a solution on one workload (the ``profile`` tool runs this in a sandboxed child process,
:func:`sandboxed_profile`, since the solution is untrusted).

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

# Imports inside functions: a child-process entry point: torch, the task and the solution load after the sandbox is set up.

NCU_METRICS = ("gpu__time_duration.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
               "dram__throughput.avg.pct_of_peak_sustained_elapsed", "sm__warps_active.avg.pct_of_peak_sustained_active")


def _setup(task_ref: str, device: str, workload: str | None):
    from d2kbench.tasks import load_task

    task = load_task(task_ref)
    if workload:
        wl = task.spec.workload(workload)
    else:
        pool = task.spec.workloads if device == "cuda" else task.spec.smoke_workloads
        wl = next((w for w in pool if not w.correctness_only and w.ranks == 1), pool[0])
    return task, wl


def run_calls(task_ref: str, solution: Path, device: str, workload: str | None, calls: int, profile: bool) -> str:
    """Run the solution ``calls`` times after one warm-up call; the profiler table if asked."""
    import torch

    from d2kbench.checking.inputs import make_args, secret_seed
    from d2kbench.tasks.loader import import_file

    task, wl = _setup(task_ref, device, workload)
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        from d2kbench.harness import interpreter_numerics

        interpreter_numerics.install()  # float conversions as on sm_90 (docs/cpu.md)
    sys.path.insert(0, str(Path(solution).parent))
    sol = import_file(Path(solution))
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
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

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


def _argv(task_ref: str, solution: Path, device: str, workload: str | None, *extra: str) -> list[str]:
    argv = [sys.executable, "-m", "d2kbench.agents.profiling", "--task", task_ref, "--solution", str(solution),
            "--device", device, *extra]
    return argv + (["--workload", workload] if workload else [])


def sandboxed_profile(cfg, path: Path, workload: str | None, timeout_s: float) -> tuple[int, str]:
    """``(exit status, output)`` of profiling the solution at ``path`` in a child process in a
    solution worker's sandbox (:func:`d2kbench.sandbox.policy.worker_policy`: the task's public
    files, a staged copy of the reviewed code, a private folder, no network).

    Raises:
        subprocess.TimeoutExpired: the child ran past ``timeout_s`` (it is killed).
    """
    import tempfile

    from d2kbench.harness.evaluate import resolve_device
    from d2kbench.harness.process import WORKER_TASK_FILES, solution_cache_dir, stage_code
    from d2kbench.sandbox import bwrap
    from d2kbench.sandbox.policy import sandbox_env, worker_policy
    from d2kbench.sandbox.process import new_group_dying_with_parent
    from d2kbench.tasks import load_task

    task = load_task(cfg.task)
    device = resolve_device(cfg.device)
    work = Path(tempfile.mkdtemp(prefix="d2k-profile-"))
    try:
        code = stage_code(path, work / "code")
        cache = solution_cache_dir(path, device)
        policy = worker_policy(task_root=task.root, task_files=WORKER_TASK_FILES, code=[], workdir=work,
                               cache_dir=cache, device=device, parent_tmp=None)
        argv = _argv(str(task.root), code, device, workload)
        cmd, env = bwrap.wrap(argv, policy) if bwrap.status().active else (argv, sandbox_env(str(work)))
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=work,
                             preexec_fn=new_group_dying_with_parent)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = out.stdout + (f"\n[stderr]\n{out.stderr[-4000:]}" if out.returncode and out.stderr.strip() else "")
    return out.returncode, text


def ncu_summary(task_ref: str, solution: Path, workload: str | None, timeout_s: float = 600.0) -> str:
    """Nsight Compute metrics of one call per kernel, or a line saying why there are none."""
    ncu = shutil.which("ncu")
    if not ncu:
        return "Nsight Compute: not available (ncu not found on PATH)."
    argv = [ncu, "--csv", "--target-processes", "all", "--metrics", ",".join(NCU_METRICS),
            *_argv(task_ref, solution, "cuda", workload, "--calls", "1", "--no-profiler")]
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
    ap.add_argument("--task", required=True, help="task id or folder")
    ap.add_argument("--solution", required=True, help="the solution file")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--workload", default=None)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--no-profiler", action="store_true", help="just run the calls (under ncu)")
    a = ap.parse_args(argv)
    sol = Path(a.solution).resolve()
    try:
        text = run_calls(a.task, sol, a.device, a.workload, a.calls, profile=not a.no_profiler)
    except Exception as e:  # noqa: BLE001 - the solution's failure is the tool's answer
        print(f"profile: the solution failed: {type(e).__name__}: {e}")
        return 1
    if a.no_profiler:
        return 0
    print(text)
    print(ncu_summary(a.task, sol, a.workload) if a.device == "cuda" else "Nsight Compute: not run (no GPU).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
