"""Agent workspaces: the shared task files, guidance for one level, a brief, and the tools.

Layout of a workspace ``DIR``::

    task.yaml  reference.py  requirements.md  template.py   shared task files (tasks.loader.SHARED_FILES)
    workloads.yaml                                           the workload list, from task.yaml
    solution.py                                              the starting point (a copy of template.py)
    GUIDANCE.md                                              guided runs only: levels up to the chosen one
    CLAUDE.md  AGENTS.md                                     the brief (GPU, rules, tools, budget)
    tools/test tools/bench tools/profile tools/submit        the tools as commands
    .mcp.json                                                the same tools as an MCP server (stdio)
    .d2k/workspace.json                                      the tools' configuration (WorkspaceConfig)

Never staged: the expert implementation and the judge rubric (nor any other file of the task
folder outside ``SHARED_FILES``).
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

import yaml
from pydantic import BaseModel, Field

from d2kbench.tasks.loader import SHARED_FILES, SUITE_DIR, Task, public_task_yaml

#: Guidance levels of runs: unguided, then cumulative (docs/protocol.md, "Runs").
GUIDANCE_LEVELS = ("none", "L1", "L1+L2", "L1+L2+L3")
LEVEL_TITLES = {"L1": "L1: algorithmic insight", "L2": "L2: dataflow", "L3": "L3: low-level mechanisms"}
#: The target GPU named in every brief (docs/protocol.md, "Runs": the H200, a Hopper GPU).
TARGET_GPU = "NVIDIA H200 (Hopper, sm_90: 132 SMs, 141 GB HBM3e at 4.8 TB/s, 60 MiB L2, FP16/BF16 tensor cores)"
TOOL_NAMES = ("test", "bench", "profile", "submit")
CONFIG_PATH = Path(".d2k") / "workspace.json"


class EvalSettings(BaseModel):
    """How the tools evaluate: workloads (default: registered on cuda, smoke on cpu), the number
    of correctness calls, timing samples on the CPU, per-request timeout (s) and the baseline
    speedups are reported against."""

    workloads: list[str] | None = None
    check_calls: int = Field(default=3, ge=1)
    cpu_samples: int = Field(default=3, ge=1)
    timeout_s: float | None = None
    baseline: str = "reference"


class WorkspaceConfig(BaseModel):
    """``.d2k/workspace.json``: what the tools need (task, device, evaluation settings, the run
    directory where submissions go)."""

    task: str
    guidance: str
    device: str = "auto"
    eval: EvalSettings = Field(default_factory=EvalSettings)
    run_dir: str
    runner: bool = False
    run_id: str | None = None
    budget_turns: int = 350
    wall_clock_s: float | None = None
    python: str = Field(default_factory=lambda: sys.executable)
    submit_timeout_s: float = 7200.0


def guidance_level_ok(level: str) -> str:
    """``level`` if it is a guidance level of runs.

    Raises:
        ValueError: not one of :data:`GUIDANCE_LEVELS`.
    """
    if level not in GUIDANCE_LEVELS:
        raise ValueError(f"unknown guidance level {level!r} (one of: {', '.join(GUIDANCE_LEVELS)})")
    return level


def highest_level(level: str) -> str:
    """``L1+L2`` -> ``L2`` (the argument of ``Guidance.up_to``); ``none`` -> ``none``."""
    return level.split("+")[-1]


def render_guidance(task: Task, level: str) -> str | None:
    """GUIDANCE.md text: every guidance item of the levels up to ``level``; None when unguided."""
    guidance_level_ok(level)
    if level == "none":
        return None
    items = task.guidance.up_to(highest_level(level))
    lines = [f"# Expert design guidance: {task.spec.title}", "",
             f"Levels given: {level}. Design rationale only: no code and no tuning constants. "
             "Items may depend on earlier items (named in 'depends on').", ""]
    for lvl in ("L1", "L2", "L3"):
        these = [i for i in items if i.level == lvl]
        if not these:
            continue
        lines += [f"## {LEVEL_TITLES[lvl]}", ""]
        for i in these:
            lines += [f"### {i.title} (`{i.id}`)", ""]
            if i.depends_on:
                lines += [f"Depends on: {', '.join(f'`{d}`' for d in i.depends_on)}", ""]
            lines += [i.text.strip(), ""]
    return "\n".join(lines)


def render_workloads(task: Task) -> str:
    """workloads.yaml text: registered workloads (timed on the H200) and smoke workloads (CPU)."""
    def one(w) -> dict:
        d: dict = {"id": w.id, "axes": dict(w.axes)}
        if w.params:
            d["params"] = dict(w.params)
        if w.correctness_only:
            d["correctness_only"] = True
        if w.source:
            d["source"] = w.source
        return d

    data = {"task": task.id,
            "registered": [one(w) for w in task.spec.workloads],
            "smoke": [one(w) for w in task.spec.smoke_workloads]}
    head = ("# Workloads of this task. 'registered' are checked (and, unless correctness_only, timed)\n"
            "# on the target GPU; 'smoke' are small shapes checked on the CPU under the Triton interpreter.\n")
    return head + yaml.safe_dump(data, sort_keys=False)


def render_brief(task: Task, cfg: WorkspaceConfig, *, has_guidance: bool) -> str:
    """The brief (CLAUDE.md / AGENTS.md): target GPU, files, tools, rules and budget."""
    budget = f"{cfg.budget_turns} turns (one turn = one model response; the harness stops the run there)"
    if cfg.wall_clock_s:
        budget += f" and {cfg.wall_clock_s / 3600:.1f} hours of wall-clock time"
    where = ("the CPU (the Triton interpreter, smoke workloads): correctness there is real, timings are not "
             "GPU timings" if cfg.device == "cpu" else "the target GPU")
    files = [
        "- `task.yaml`: the specification: arguments, outputs, tolerances, state updates, workloads, timing mode.",
        "- `reference.py`: the seeded input generator (`make_inputs`) and the PyTorch reference `run(...)`, "
        "which defines the semantics and is the correctness oracle.",
        "- `requirements.md`: the implementation requirements (read them: they are checked on every call).",
        "- `workloads.yaml`: the registered workloads (timed on the target GPU) and the CPU smoke workloads.",
        "- `template.py`: the solution template; `solution.py` starts as a copy of it. **Write your solution in "
        "`solution.py`.**",
    ]
    if has_guidance:
        files.append("- `GUIDANCE.md`: expert design guidance for this task (design rationale, no code). Use it.")
    return "\n".join([
        f"# D2K-Bench task `{task.id}`: {task.spec.title}", "",
        f"Write a fast and correct implementation of `run(...)` in `solution.py` with your own Triton kernels. "
        f"The target GPU is an **{TARGET_GPU}**; submissions are timed there and scored by their speedup over "
        f"the baseline (geometric mean over the registered workloads).", "",
        "## Files", "", *files, "",
        "## Tools", "",
        f"Each tool is a command in `tools/` (run it from this directory) and a tool of the MCP server `d2k`. "
        f"Here they run on {where}.", "",
        "- `tools/test` (MCP `test`): correctness of `solution.py` on every workload, with the failing checks.",
        "- `tools/bench` (MCP `bench`): latency and speedup per workload against the baseline, and the geomean.",
        "- `tools/profile` (MCP `profile`): a profiler summary (kernel table; Nsight Compute metrics where "
        "available) of `solution.py` on one workload (`--workload ID`).",
        "- `tools/submit [--note TEXT]` (MCP `submit`): snapshot `solution.py` as a candidate and evaluate it. "
        "Every submission is evaluated; your final answer is the fully correct submission with the highest "
        "geometric-mean speedup, so submit each improvement as soon as it passes `tools/test`.", "",
        "## Rules", "",
        "- The timed computation must run in your own Triton kernels; PyTorch only for glue. Follow "
        "`requirements.md` (no existing operator implementations, no caching of results across calls).",
        "- Work only inside this directory. Do not look for, read or reconstruct any other implementation of "
        "this task (an expert solution or grading material exists outside; using it invalidates the run).",
        "- No network access; do not install packages.",
        "- Do not modify the tools, `reference.py` or `task.yaml`; they are not what is evaluated.", "",
        "## Budget", "",
        f"{budget}. Candidates submitted before the stop count.", "",
    ])


def tool_script(cfg: WorkspaceConfig, tool: str) -> str:
    """The text of ``tools/<tool>``: runs :mod:`d2kbench.agents.tool_cli` on this workspace."""
    return ("#!/bin/sh\n"
            f"# D2K-Bench tool '{tool}': see CLAUDE.md / AGENTS.md\n"
            'WS="$(cd "$(dirname "$0")/.." && pwd)"\n'
            f"exec {shlex.quote(cfg.python)} -m d2kbench.agents.tool_cli {tool} --workspace \"$WS\" \"$@\"\n")


def mcp_server_spec(cfg: WorkspaceConfig, workspace: Path) -> dict:
    """The stdio MCP server of a workspace: ``{"command", "args", "env"}``."""
    env = {"PYTHONUNBUFFERED": "1"}
    return {"command": cfg.python, "args": ["-m", "d2kbench.agents.mcp_server", "--workspace", str(workspace)],
            "env": env}


def stage_workspace(task: Task, directory: str | Path, guidance: str, *, device: str = "auto",
                    eval_settings: EvalSettings | None = None, run_dir: str | Path | None = None,
                    runner: bool = False, run_id: str | None = None, budget_turns: int = 350,
                    wall_clock_s: float | None = None) -> Path:
    """Create a workspace for ``task`` at ``guidance`` level in ``directory``.

    Args:
        task: a loaded task.
        directory: created if missing; must be empty if it exists.
        guidance: one of :data:`GUIDANCE_LEVELS`.
        device: where the tools evaluate (``auto``, ``cuda``, ``cpu``).
        eval_settings: how the tools evaluate (:class:`EvalSettings`).
        run_dir: where submissions are snapshotted (default ``DIR/.d2k/run``).
        runner: True when a runner evaluates submissions (the submit tool then waits for it).
        run_id, budget_turns, wall_clock_s: named in the brief and the configuration.

    Returns:
        The workspace path.

    Raises:
        ValueError: unknown guidance level, or a non-empty directory.
    """
    guidance_level_ok(guidance)
    ws = Path(directory).resolve()
    if ws.exists() and any(ws.iterdir()):
        raise ValueError(f"workspace directory {ws} is not empty")
    ws.mkdir(parents=True, exist_ok=True)
    task_ref = task.id if (SUITE_DIR / task.id).resolve() == task.root.resolve() else str(task.root)
    cfg = WorkspaceConfig(task=task_ref, guidance=guidance, device=device, eval=eval_settings or EvalSettings(),
                          run_dir=str(Path(run_dir).resolve() if run_dir else ws / ".d2k" / "run"), runner=runner,
                          run_id=run_id, budget_turns=budget_turns, wall_clock_s=wall_clock_s)
    for name in SHARED_FILES:
        if name == "task.yaml":
            (ws / name).write_text(public_task_yaml(task.root))
        else:
            shutil.copyfile(task.root / name, ws / name)
    shutil.copyfile(task.root / "template.py", ws / "solution.py")
    (ws / "workloads.yaml").write_text(render_workloads(task))
    text = render_guidance(task, guidance)
    if text is not None:
        (ws / "GUIDANCE.md").write_text(text)
    brief = render_brief(task, cfg, has_guidance=text is not None)
    (ws / "CLAUDE.md").write_text(brief)
    (ws / "AGENTS.md").write_text(brief)
    tools = ws / "tools"
    tools.mkdir()
    for t in TOOL_NAMES:
        p = tools / t
        p.write_text(tool_script(cfg, t))
        p.chmod(0o755)
    (ws / ".mcp.json").write_text(json.dumps({"mcpServers": {"d2k": {"type": "stdio", **mcp_server_spec(cfg, ws)}}},
                                             indent=1))
    (ws / ".d2k").mkdir(exist_ok=True)
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    (ws / CONFIG_PATH).write_text(cfg.model_dump_json(indent=1))
    return ws


def load_config(workspace: str | Path) -> WorkspaceConfig:
    """The configuration of a staged workspace.

    Raises:
        FileNotFoundError: ``workspace`` is not a staged workspace.
    """
    p = Path(workspace) / CONFIG_PATH
    if not p.is_file():
        raise FileNotFoundError(f"{workspace} is not a D2K workspace (no {CONFIG_PATH}); create one with "
                                f"`d2k workspace TASK DIR`")
    return WorkspaceConfig.model_validate_json(p.read_text())


def workspace_files(workspace: str | Path) -> list[Path]:
    """Every file of a workspace (relative paths), the run directory excluded."""
    ws = Path(workspace)
    out = []
    for root, dirs, files in os.walk(ws):
        dirs[:] = [d for d in dirs if not (Path(root) / d == ws / ".d2k" / "run")]
        out += [(Path(root) / f).relative_to(ws) for f in files]
    return sorted(out)


@contextmanager
def locked_dir(run_dir: Path):
    """Hold the run directory's submission lock (``.submit.lock``, an exclusive ``flock``)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".submit.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
