"""``d2k workspace``, ``d2k run`` and ``d2k agent-tool``: agent workspaces and runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from d2kbench.terminal import print_error

# Imports inside functions: `d2k --help` and each command load only what that command needs (torch, the
# harness, provider SDKs): start-up time.

console = Console()


def parse_options(items: list[str] | None) -> dict:
    """``KEY=VALUE`` pairs (values parsed as JSON when they are JSON, else kept as text)."""
    out: dict = {}
    for item in items or []:
        if "=" not in item:
            raise typer.BadParameter(f"--option {item!r} is not KEY=VALUE")
        k, v = item.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


#: The agent commands: a typer app whose commands :mod:`d2kbench.cli` adds to ``d2k``.
app = typer.Typer()


@app.command("workspace")
def workspace_cmd(
    task: str = typer.Argument(..., help="task id (or task folder)"),
    directory: Path = typer.Argument(..., help="where to create the workspace (must be new or empty)"),
    guidance: str = typer.Option("none", "--guidance", "-g", help="none, L1, L1+L2 or L1+L2+L3"),
    device: str = typer.Option("auto", help="where the tools evaluate: auto, cuda or cpu"),
    budget_turns: int = typer.Option(350, "--budget-turns", help="turn budget named in the brief"),
) -> None:
    """Stage an agent workspace: shared task files, guidance for the level, brief, tools."""
    from d2kbench.agents.workspace import stage_workspace, workspace_files
    from d2kbench.tasks import TaskFileError, load_task

    try:
        t = load_task(task)
        ws = stage_workspace(t, directory, guidance, device=device, budget_turns=budget_turns)
    except (TaskFileError, ValueError) as e:
        print_error(console, e)
        raise typer.Exit(2) from None
    console.print(f"workspace for [bold]{t.id}[/bold] (guidance {guidance}) at {ws}")
    for f in workspace_files(ws):
        console.print(f"  {f}", highlight=False)

@app.command("agent-tool")
def agent_tool_cmd(
    tool: str = typer.Argument(..., help="test, bench, profile or submit"),
    workspace: Path = typer.Option(Path("."), "--workspace", "-w", help="the workspace directory"),
    note: str = typer.Option("", help="submit: a note on the candidate"),
    workload: Optional[str] = typer.Option(None, help="profile: the workload id"),
) -> None:
    """Run one agent tool on a workspace (the same as the workspace's tools/<name>)."""
    from d2kbench.agents.tool_cli import main

    raise typer.Exit(main([tool, "--workspace", str(workspace), "--note", note]
                          + (["--workload", workload] if workload else [])))

@app.command("run")
def run_cmd(
    task: str = typer.Argument(..., help="task id"),
    model: str = typer.Option(..., "--model", "-m", help="the provider's model id"),
    backend: str = typer.Option(..., "--backend", "-b", help="openai, anthropic, claude-code or codex"),
    guidance: str = typer.Option("none", "--guidance", "-g", help="none, L1, L1+L2 or L1+L2+L3"),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="API base URL (vLLM, SGLang, gateway)"),
    budget_turns: int = typer.Option(350, "--budget-turns", help="most model responses"),
    wall_clock: float = typer.Option(6 * 3600, "--wall-clock", help="wall-clock limit in seconds"),
    device: str = typer.Option("auto", "--device", help="auto, cuda or cpu"),
    seed: int = typer.Option(0, help="replicate index"),
    option: Optional[list[str]] = typer.Option(None, "--option", "-o", help="backend option KEY=VALUE"),
    store_path: Optional[Path] = typer.Option(None, "--store", help="SQLite store (default ./d2k.sqlite)"),
    runs_root: Path = typer.Option(Path("runs"), "--runs-dir", help="where run directories go"),
) -> None:
    """Run one agent on one task and record trajectory, candidates, usage and cost."""
    from pydantic import ValidationError

    from d2kbench.agents.runner import RunSpec, run_agent
    from d2kbench.store import DEFAULT_PATH

    try:
        spec = RunSpec.model_validate(dict(task=task, model=model, backend=backend, guidance=guidance,
                                           base_url=base_url, budget_turns=budget_turns, wall_clock_s=wall_clock,
                                           device=device, seed=seed, backend_options=parse_options(option)))
    except ValidationError as e:
        for err in e.errors():
            print_error(console, f"{'.'.join(map(str, err['loc']))}: {err['msg']}")
        raise typer.Exit(2) from None
    store = store_path or DEFAULT_PATH
    from d2kbench.store import Store

    held = Store(store)
    attempt = max([0, *(r["attempt"] for k in spec.keys() for r in held.runs_of(run_key=k))]) + 1
    held.close()
    out = run_agent(spec, store_path=store, runs_root=runs_root, attempt=attempt,
                    progress=lambda m: console.print(m, highlight=False, markup=False))
    t = Table("run", "status", "exit", "turns", "candidates", "final", "speedup", "cost $", "CLI cost $",
              title=spec.label())
    t.add_row(out.run_id, out.status, out.exit_reason or "-", str(out.turns), str(out.candidates),
              str(out.final_candidate or "-"), f"{out.final_speedup:.3f}" if out.final_speedup else "-",
              f"{out.cost_usd:.4f}" if out.cost_usd is not None else "unknown",
              f"{out.cli_cost_usd:.4f}" if out.cli_cost_usd is not None else "-")
    console.print(t)
    if out.unpriced_models:
        console.print(f"[yellow]warning: cost unknown: no price for {', '.join(out.unpriced_models)} in the price "
                      "table (prices.yaml); the run's cost is not US$0[/yellow]", highlight=False)
    if out.error:
        print_error(console, out.error.splitlines()[0])
    raise typer.Exit(0 if out.status == "finished" else 1)
