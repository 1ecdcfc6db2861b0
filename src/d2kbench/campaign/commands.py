"""``d2k campaign PLAN.yaml``: run (or resume) a campaign with a live progress display."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from d2kbench.terminal import print_error

# Imports inside functions: `d2k --help` and each command load only what that command needs (torch, the
# harness, provider SDKs): start-up time.

console = Console()


#: ``campaign``: a typer app whose commands :mod:`d2kbench.cli` adds to ``d2k``.
app = typer.Typer()


@app.command("campaign")
def campaign_cmd(
    plan_path: Path = typer.Argument(..., help="the plan (YAML)"),
    executor: str = typer.Option("local", "--executor", "-e", help="local or ray"),
    store_path: Optional[Path] = typer.Option(None, "--store", help="SQLite store (default ./d2k.sqlite)"),
    runs_root: Optional[Path] = typer.Option(None, "--runs-dir", help="run directories (default: beside the store)"),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="start a new attempt of failed runs"),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Ray cluster address (default: local)"),
    ray_num_cpus: Optional[int] = typer.Option(None, "--ray-num-cpus", help="CPUs of a local Ray instance"),
    dry_run: bool = typer.Option(False, "--dry-run", help="list the runs and what is done; start nothing"),
) -> None:
    """Run the plan's runs that are not finished yet (resumable: a killed campaign restarts
    where it stopped, never redoing a finished run)."""
    from d2kbench.campaign.executors import make_executor, runs_root_default
    from d2kbench.campaign.plan import PlanError, load_plan
    from d2kbench.campaign.runner import run_campaign
    from d2kbench.campaign.state import CampaignBusy
    from d2kbench.store import DEFAULT_PATH, Store

    try:
        plan = load_plan(plan_path)
        ex = make_executor(executor, device=plan.device, gpus=plan.gpus, concurrency=plan.concurrency,
                           ray_address=ray_address, ray_num_cpus=ray_num_cpus)
    except (PlanError, ValueError) as e:
        print_error(console, e)
        raise typer.Exit(2) from None
    store = Path(store_path or DEFAULT_PATH)
    root = runs_root or runs_root_default(store)
    runs = plan.runs()
    if dry_run:
        with Store(store) as s:
            console.print(_dry_run_table(plan.name, runs, s))
        return
    lock = threading.Lock()
    with Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as prog:
        bar = prog.add_task(f"campaign {plan.name} ({ex.name})", total=len(runs))
        running: set[str] = set()

        def describe() -> str:
            return f"campaign {plan.name} ({ex.name}): {len(running)} running"

        def on_schedule(s) -> None:
            prog.update(bar, completed=len(s.done))
            if s.interrupted:
                prog.console.print(f"resuming: {len(s.interrupted)} interrupted attempt(s) restart: "
                                   + ", ".join(s.interrupted), highlight=False)
            prog.console.print(f"{len(s.done)} of {len(runs)} runs already done; {len(s.todo)} to run",
                               highlight=False)

        def on_start(job, info) -> None:
            with lock:
                running.add(job.run_id)
                gpu = info.get("gpu")
                prog.console.print(f"start  {job.run_id}  {job.spec.label()}" + (f"  GPU {gpu}" if gpu else ""),
                                   highlight=False, markup=False)
                prog.update(bar, description=describe())

        def on_done(job, out) -> None:
            with lock:
                running.discard(job.run_id)
                prog.console.print(_outcome_line(job, out), highlight=False, markup=False)
                prog.update(bar, advance=1, description=describe())

        try:
            res = run_campaign(plan, store_path=store, runs_root=root, executor=ex, retry_failed=retry_failed,
                               on_schedule=on_schedule, on_start=on_start, on_done=on_done)
        except CampaignBusy as e:
            print_error(console, e)
            raise typer.Exit(3) from None
    failed = [o for o in res.outcomes if o.get("status") != "finished"]
    console.print(f"campaign {plan.name}: {res.planned} planned, {res.already_done} were done, {res.started} run now "
                  f"({len(res.outcomes) - len(failed)} finished, {len(failed)} failed); store {store}")
    raise typer.Exit(1 if failed else 0)


def _dry_run_table(name: str, runs: list, store) -> Table:
    """``--dry-run``: every planned run with its attempts so far and the last one's status."""
    t = Table("key", "task", "model", "backend", "guidance", "seed", "attempts", "status", title=name)
    for spec in runs:
        rows = sorted((r for k in spec.keys() for r in store.runs_of(run_key=k)),
                      key=lambda r: (r["started_at"], r["run_id"]))  # older identities too
        t.add_row(spec.key(), spec.task, spec.model, spec.backend, spec.guidance, str(spec.seed),
                  str(len(rows)), rows[-1]["status"] if rows else "planned")
    return t


def _outcome_line(job, out: dict) -> str:
    """One finished run: status, id, label, exit reason, candidates, final speedup, cost, error."""
    sp = out.get("final_speedup")
    return (f"{out.get('status', '?'):8s} {job.run_id}  {job.spec.label()}  exit={out.get('exit_reason')} "
            f"candidates={out.get('candidates', 0)} speedup={f'{sp:.3f}' if sp else '-'} "
            + (f"cost=${out['cost_usd']:.4f}" if out.get("cost_usd") is not None else
               f"cost=unknown (no price for {', '.join(out.get('unpriced_models') or ['a model'])})")
            + (f"  error: {str(out['error']).splitlines()[0][:120]}" if out.get("error") else ""))
