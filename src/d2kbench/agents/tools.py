"""The agent tools: test, bench, profile and submit, shared by the CLI commands, the MCP
server and the built-in loop.

* ``test``: correctness of ``solution.py`` on every workload (no timing).
* ``bench``: correctness and latency per workload, speedup against the baseline, geomean.
* ``profile``: a profiler summary of ``solution.py`` on one workload (a child process).
* ``submit``: snapshot ``solution.py`` (content-hashed copy in the run directory) and have it
  evaluated as a candidate; see :mod:`d2kbench.agents.submissions`.

Every tool returns a :class:`ToolOutput`; none raises for a failing solution.
"""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from pathlib import Path

from pydantic import BaseModel, Field

from d2kbench.agents.workspace import WorkspaceConfig, load_config

#: Most characters of tool output handed to a model (head and tail kept).
OUTPUT_LIMIT = 16000


class ToolOutput(BaseModel):
    """A tool's answer: ``text`` for the model, ``data`` for the trajectory, ``ok`` False when
    the tool failed or the solution did not pass; ``is_error`` True only when the tool itself
    could not do its job (bad arguments, a crash), not for a failing solution."""

    text: str
    ok: bool = True
    is_error: bool = False
    data: dict = Field(default_factory=dict)


def clip(text: str, limit: int = OUTPUT_LIMIT) -> str:
    """Keep the head and tail of a long text, saying how much was cut."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + f"\n... [{len(text) - limit} characters cut] ...\n" + text[-half:]


def load_task_of(cfg: WorkspaceConfig):
    from d2kbench.tasks import load_task

    return load_task(cfg.task)


def _workloads(task, cfg: WorkspaceConfig, device: str):
    from d2kbench.harness.evaluate import default_workloads

    if cfg.eval.workloads:
        return [task.spec.workload(w) for w in cfg.eval.workloads]
    return default_workloads(task, device)


def _options(cfg: WorkspaceConfig, *, timed: bool):
    from d2kbench.harness.evaluate import Options

    return Options(check_calls=cfg.eval.check_calls, cpu_samples=cfg.eval.cpu_samples, timeout_s=cfg.eval.timeout_s,
                   time_solutions=timed)


def evaluation_text(ev, title: str) -> str:
    """A markdown table of an evaluation plus its summary line."""
    from d2kbench.report.evaluation import COLUMNS, rows, summary

    lines = [f"## {title}", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r[c] for c in COLUMNS) + " |" for r in rows(ev)]
    fails = [r for r in ev.candidate.results if r.status.failed]
    for r in fails:
        bad = [c for c in r.checks if not c.passed][:3]
        for c in bad:
            lines.append(f"- {r.workload}: call {c.call} {c.name} failed: {c.detail}".rstrip())
        for v in r.violations:
            lines.append(f"- {r.workload}: integrity rule {v.rule}: {v.evidence}")
    lines += ["", summary(ev)]
    return "\n".join(lines)


def evaluate_solution(cfg: WorkspaceConfig, path: Path, *, timed: bool, baseline: bool, store=None):
    """Run the harness on ``path`` with the workspace's settings; returns the Evaluation.

    Raises:
        FileNotFoundError, ValueError: bad task / device / workload configuration.
    """
    from d2kbench.harness.evaluate import evaluate, resolve_device

    task = load_task_of(cfg)
    device = resolve_device(cfg.device)
    return evaluate(task, path, _workloads(task, cfg, device), device,
                    cfg.eval.baseline if baseline and cfg.eval.baseline != "none" else None, store=store,
                    options=_options(cfg, timed=timed))


def tool_test(workspace: Path) -> ToolOutput:
    """Correctness of ``solution.py`` on every configured workload."""
    cfg = load_config(workspace)
    ev = evaluate_solution(cfg, Path(workspace) / "solution.py", timed=False, baseline=False)
    ok = ev.candidate.eligible
    head = "ALL CHECKS PASSED" if ok else "SOME CHECKS FAILED"
    return ToolOutput(text=clip(f"{head}\n\n" + evaluation_text(ev, f"test: solution.py on {ev.device}")), ok=ok,
                      data={"eval_id": ev.id, "eligible": ok,
                            "status": {r.workload: r.status.value for r in ev.candidate.results}})


def tool_bench(workspace: Path) -> ToolOutput:
    """Correctness and latency of ``solution.py``, with speedups against the baseline."""
    cfg = load_config(workspace)
    ev = evaluate_solution(cfg, Path(workspace) / "solution.py", timed=True, baseline=True)
    return ToolOutput(text=clip(evaluation_text(ev, f"bench: solution.py vs {cfg.eval.baseline} on {ev.device}")),
                      ok=ev.candidate.eligible,
                      data={"eval_id": ev.id, "eligible": ev.candidate.eligible, "geomean_speedup": ev.geomean_speedup})


def tool_profile(workspace: Path, workload: str | None = None, timeout_s: float = 900.0) -> ToolOutput:
    """Profile ``solution.py`` on one workload in a child process (torch.profiler kernel table;
    Nsight Compute metrics where ``ncu`` is installed and the device is a GPU)."""
    cfg = load_config(workspace)
    argv = [cfg.python, "-m", "d2kbench.agents.profiling", "--workspace", str(workspace)]
    if workload:
        argv += ["--workload", workload]
    env = dict(os.environ)
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=workspace,
                             start_new_session=True)
    except subprocess.TimeoutExpired:
        return ToolOutput(text=f"profile: timed out after {timeout_s:.0f} s", ok=False)
    text = out.stdout + (f"\n[stderr]\n{out.stderr[-4000:]}" if out.returncode and out.stderr.strip() else "")
    return ToolOutput(text=clip(text.strip() or "(no output)"), ok=out.returncode == 0,
                      data={"returncode": out.returncode})


def tool_submit(workspace: Path, note: str = "", turn: int | None = None, source: str = "cli") -> ToolOutput:
    """Snapshot and evaluate ``solution.py`` as a candidate (see :mod:`d2kbench.agents.submissions`)."""
    from d2kbench.agents.submissions import submit

    res = submit(Path(workspace), note=note, turn=turn, source=source)
    return ToolOutput(text=clip(res.text), ok=res.status == "evaluated" and bool(res.eligible),
                      data=res.model_dump(exclude={"text"}))


def run_tool(workspace: str | Path, name: str, args: dict | None = None, *, turn: int | None = None,
             source: str = "cli") -> ToolOutput:
    """Run tool ``name`` (``test``, ``bench``, ``profile``, ``submit``) on a workspace.

    Never raises for solution failures or tool errors: a tool that crashes answers with
    ``ok=False`` and the error text.

    Raises:
        ValueError: unknown tool name.
    """
    args = dict(args or {})
    ws = Path(workspace).resolve()
    fns = {"test": lambda: tool_test(ws), "bench": lambda: tool_bench(ws),
           "profile": lambda: tool_profile(ws, args.get("workload")),
           "submit": lambda: tool_submit(ws, note=str(args.get("note") or ""), turn=turn, source=source)}
    if name not in fns:
        raise ValueError(f"unknown tool {name!r} (test, bench, profile, submit)")
    try:
        return fns[name]()
    except Exception as e:  # noqa: BLE001 - reported to the agent, never a crash of the run
        tb = traceback.format_exc(limit=4)
        print(tb, file=sys.stderr)
        return ToolOutput(text=f"{name}: tool error: {type(e).__name__}: {e}", ok=False, is_error=True,
                          data={"error": f"{type(e).__name__}: {e}"})
