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

import subprocess
from pathlib import Path

from pydantic import BaseModel, Field

from d2kbench.agents.workspace import WorkspaceConfig

# Imports inside functions: the sandboxed agent's tool CLI imports this module; the harness (and torch) load only when a
# tool runs in this process.

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
    from d2kbench.harness.summary import COLUMNS, rows, summary

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


def tool_test(cfg: WorkspaceConfig, path: Path) -> ToolOutput:
    """Correctness of the solution at ``path`` on every configured workload."""
    ev = evaluate_solution(cfg, path, timed=False, baseline=False)
    ok = ev.candidate.eligible
    head = "ALL CHECKS PASSED" if ok else "SOME CHECKS FAILED"
    return ToolOutput(text=clip(f"{head}\n\n" + evaluation_text(ev, f"test: solution.py on {ev.device}")), ok=ok,
                      data={"eval_id": ev.id, "eligible": ok,
                            "status": {r.workload: r.status.value for r in ev.candidate.results}})


def tool_bench(cfg: WorkspaceConfig, path: Path) -> ToolOutput:
    """Correctness and latency of the solution at ``path``, with speedups against the baseline."""
    ev = evaluate_solution(cfg, path, timed=True, baseline=True)
    return ToolOutput(text=clip(evaluation_text(ev, f"bench: solution.py vs {cfg.eval.baseline} on {ev.device}")),
                      ok=ev.candidate.eligible,
                      data={"eval_id": ev.id, "eligible": ev.candidate.eligible, "geomean_speedup": ev.geomean_speedup})


def tool_profile(cfg: WorkspaceConfig, path: Path, workload: str | None = None, timeout_s: float = 900.0) -> ToolOutput:
    """Profile the solution at ``path`` on one workload (torch.profiler kernel table; Nsight
    Compute metrics where ``ncu`` is installed and the device is a GPU), in a child process in
    the same OS sandbox as a harness worker: the solution is untrusted."""
    from d2kbench.agents.profiling import sandboxed_profile

    try:
        code, text = sandboxed_profile(cfg, path, workload, timeout_s)
    except subprocess.TimeoutExpired:
        return ToolOutput(text=f"profile: timed out after {timeout_s:.0f} s", ok=False)
    return ToolOutput(text=clip(text.strip() or "(no output)"), ok=code == 0, data={"returncode": code})


def run_local(cfg: WorkspaceConfig, name: str, path: Path, args: dict | None = None) -> ToolOutput:
    """``test``, ``bench`` or ``profile`` of the solution at ``path``, run from this process
    (the runner answering a sandboxed agent's request, the built-in loop, a hand-made
    workspace).

    Raises:
        ValueError: another tool name.
    """
    args = dict(args or {})
    if name == "test":
        return tool_test(cfg, path)
    if name == "bench":
        return tool_bench(cfg, path)
    if name == "profile":
        return tool_profile(cfg, path, args.get("workload"))
    raise ValueError(f"unknown tool {name!r} (test, bench, profile)")
