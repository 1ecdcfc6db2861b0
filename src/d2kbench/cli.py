"""``d2k``: the command line. Thin: parses, calls the library, prints tables."""

from __future__ import annotations

import atexit
import json
import os
import signal
import sqlite3
import threading
from pathlib import Path
from typing import NoReturn, Optional

import typer
from rich.console import Console
from rich.table import Table

from d2kbench.agents import commands as agents_commands
from d2kbench.campaign import commands as campaign_commands
from d2kbench.integrity import commands as integrity_commands
from d2kbench.judge import commands as judge_commands
from d2kbench.report import commands as report_commands
from d2kbench.terminal import print_error

# Imports inside functions: `d2k --help` and each command load only what that command needs (torch, the
# harness, provider SDKs): start-up time.

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="D2K-Bench: evaluate Triton kernels written from expert designs.")
console = Console()


def _terminate_like_ctrl_c(signum: int, _frame) -> None:
    """SIGTERM (a ``timeout`` wrapper, a job scheduler) unwinds like Ctrl-C: workers are closed
    and a running evaluation is recorded ``interrupted`` in the store. The process still ends by
    SIGTERM (exit status -15, which campaign executors read as killed from outside), and a second
    SIGTERM during the clean-up ends it at once."""
    from d2kbench.harness import forkserver

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    atexit.register(os.kill, os.getpid(), signal.SIGTERM)
    atexit.register(forkserver.shutdown)  # runs before the kill (last in, first out)
    raise KeyboardInterrupt(f"signal {signum}")


@app.callback()
def _main() -> None:
    """D2K-Bench: evaluate Triton kernels written from expert designs."""
    if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
        signal.signal(signal.SIGTERM, _terminate_like_ctrl_c)


def _error(msg: str) -> None:
    """Print an error message in red as plain text: never hard-wrapped (a path or a value stays on
    one line, whatever the terminal width) and never read as rich markup (``[...]`` is kept)."""
    print_error(console, msg)


def _refuse(e: Exception) -> NoReturn:
    """Print a bad-input error (a KeyError's message without the quotes ``str`` adds) and exit 2."""
    _error(e.args[0] if isinstance(e, KeyError) and e.args else str(e))
    raise typer.Exit(2) from None


def _warn_slow_on_cpu(task, device: str, workloads) -> None:
    """Registered (GPU-sized) workloads on the CPU run under the Triton interpreter: say so."""
    big = [w.id for w in workloads if device == "cpu" and w not in task.spec.smoke_workloads]
    if big:
        console.print(f"[yellow]note: {', '.join(big)} {'is' if len(big) == 1 else 'are'} GPU-sized; on the CPU "
                      "(Triton interpreter) expect minutes to hours per workload. The smoke workloads are the "
                      "CPU's default.[/yellow]", highlight=False)


def _say_skipped(task, device: str, explicit: bool) -> None:
    """Name the registered workloads the default set leaves out (distributed ones: the GPUs they
    need); a workload asked for with --workload runs and is reported not_run with that reason."""
    from d2kbench.harness.evaluate import skipped_by_default

    for line in [] if explicit else skipped_by_default(task, device):
        console.print(f"[yellow]skipped {line}[/yellow]", highlight=False, markup=True)


def _task(task_id: str):
    from d2kbench.tasks import TaskFileError, load_task

    try:
        return load_task(task_id)
    except TaskFileError as e:
        _refuse(e)


@app.command()
def tasks() -> None:
    """List the tasks of the suite."""
    from d2kbench.tasks import TaskFileError, list_tasks, load_task

    table = Table("task", "category", "workloads", "smoke", "timing", "title")
    for tid in list_tasks():
        try:
            t = load_task(tid)
        except TaskFileError as e:
            table.add_row(tid, "[red]invalid[/red]", "-", "-", "-", str(e).splitlines()[0][:60])
            continue
        s = t.spec
        timed = sum(not w.correctness_only for w in s.workloads)
        table.add_row(tid, s.category, f"{timed} (+{len(s.workloads) - timed} adv.)", str(len(s.smoke_workloads)),
                      s.timing.mode, s.title)
    console.print(table)


@app.command()
def show(task: str) -> None:
    """Show a task: specification, workloads with SOL figures, files."""
    from d2kbench.scoring.sol import DATASHEET, MEASURED, sol_ms

    t = _task(task)
    s = t.spec
    console.print(f"[bold]{s.id}[/bold]: {s.title}  ({s.category}, timing: {s.timing.mode})")
    console.print("origin: " + "; ".join(s.origin), markup=False)
    console.print(s.description.rstrip(), markup=False, highlight=False)
    args = Table("argument", "kind", "shape", "dtype", "layout", "mutable", title="run(...) arguments")
    for a in s.args:
        if a.kind == "tensor":
            kind = f"list of {a.count} tensors" if a.count else "tensor"
            args.add_row(a.name, kind, str(a.shape), a.dtype, a.layout, "yes" if a.mutable else "")
        else:
            args.add_row(a.name, a.kind, "", "", "", "")
    console.print(args)
    outs = Table("output", "shape", "dtype", "checks", title="outputs")
    for o in s.outputs:
        desc = "; ".join(f"{c.metric} vs {c.against} <= {c.max if c.max is not None else (c.atol, c.rtol)}" for c in o.checks)
        outs.add_row(o.name, str(o.shape), o.dtype, desc)
    console.print(outs)
    ceil, sheet = MEASURED["H200"], DATASHEET["H200"]
    wl = Table("workload", "axes", "kind", "SOL ref ms", f"SOL {s.sol.floor} ms", "bound", "datasheet ms", "source",
               title="workloads (SOL on H200, measured ceilings)")
    for w in s.all_workloads():
        ref_ms, _ = sol_ms(s.sol.reference, w.axes, ceil)
        floor_ms, bind = sol_ms(s.sol.counts(s.sol.floor), w.axes, ceil)
        sheet_ms, _ = sol_ms(s.sol.counts(s.sol.floor), w.axes, sheet)
        kind = "smoke" if w in s.smoke_workloads else ("correctness" if w.correctness_only else "timed")
        axes = ", ".join(f"{k}={v}" for k, v in {**w.axes, **w.params}.items())
        wl.add_row(w.id, axes, kind, f"{ref_ms:.4f}", f"{floor_ms:.4f}", bind, f"{sheet_ms:.4f}", w.source[:40])
    console.print(wl)
    if s.alternatives:
        alts = Table("solution", "runs", "devices", "what a user would run", title="alternatives (trusted comparators)")
        for a in s.alternatives:
            alts.add_row(f"alt:{a.name}", a.file or "torch.compile(reference.run)", ", ".join(a.devices), a.description)
        console.print(alts)
    files = sorted(str(p.relative_to(t.root)) for p in t.root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    console.print("files: " + ", ".join(files))


@app.command()
def validate(task: list[str] = typer.Argument(None, help="task ids (default: all)"),
             no_smoke: bool = typer.Option(False, "--no-smoke", help="skip running the smoke workloads"),
             no_alternatives: bool = typer.Option(False, "--no-alternatives",
                                                  help="skip running the alternatives (alt:NAME) on the smoke workloads"),
             ) -> None:
    """Check every task folder against the task contract (alternatives included)."""
    from d2kbench.harness.validate import validate_task
    from d2kbench.tasks.loader import list_tasks

    ids = task or list_tasks()
    bad = 0
    for tid in ids:
        problems = validate_task(tid, run_smoke=not no_smoke, run_alternatives=not no_alternatives)
        if problems:
            bad += 1
            console.print(f"[red]FAIL[/red] {tid}")
            for p in problems:
                console.print(f"  {p}", markup=False, highlight=False)
        else:
            console.print(f"[green]ok[/green]   {tid}")
    if bad:
        raise typer.Exit(1)


@app.command("eval")
def eval_cmd(
    task: str,
    solution: str = typer.Argument(..., help="a solution of the task (straightforward, expert, reference), "
                                             "an alternative (alt:NAME, see `d2k show`) or a path"),
    workload: Optional[list[str]] = typer.Option(None, "--workload", "-w", help="workload id (repeatable)"),
    device: str = typer.Option("auto", help="auto, cuda or cpu (cpu: smoke workloads, Triton interpreter)"),
    baseline: str = typer.Option("reference", help="reference, straightforward, expert, alt:NAME, a path, or none"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="write the evaluation(s) as JSON"),
    markdown: Optional[Path] = typer.Option(None, "--markdown", help="write a markdown table"),
    store_path: Path = typer.Option(None, "--store", help="SQLite results store (default ./d2k.sqlite or $D2K_STORE)"),
    repeat: int = typer.Option(1, min=1, max=5, help="evaluate N times (harness repeatability)"),
    timeout: Optional[float] = typer.Option(None, help="seconds per worker request (default: scaled to the "
                                            "workload: the reference's time plus a compile allowance)"),
    keep_going: bool = typer.Option(False, "--keep-going", help="run every workload even after a timeout or a "
                                    "dead worker (default: the remaining ones are not run)"),
) -> None:
    """Check and time SOLUTION on TASK's workloads against a baseline."""
    from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

    from d2kbench.harness.evaluate import Options, default_workloads, evaluate, resolve_device
    from d2kbench.harness.summary import COLUMNS, overhead_line, rows, summary, to_markdown
    from d2kbench.store import DEFAULT_PATH, Store

    t = _task(task)
    try:
        dev = resolve_device(device)
        wls = [t.spec.workload(w) for w in workload] if workload else default_workloads(t, dev)
        _say_skipped(t, dev, bool(workload))
        t.resolve_solution(solution, dev)
        if baseline != "none":
            t.resolve_solution(baseline, dev)
    except (ValueError, KeyError, FileNotFoundError) as e:
        _refuse(e)
    _warn_slow_on_cpu(t, dev, wls)
    store = Store(store_path or DEFAULT_PATH)
    evs = []
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                  transient=True) as prog:
        for i in range(repeat):
            bar = prog.add_task(f"evaluating {solution} on {t.id} ({dev})")

            def show(m: str, b: TaskID = bar, n: int = i + 1) -> None:
                prog.update(b, description=f"[{n}/{repeat}] {m}")

            evs.append(evaluate(t, solution, wls, dev, None if baseline == "none" else baseline, store=store,
                                options=Options(timeout_s=timeout, keep_going=keep_going), progress=show))
            prog.remove_task(bar)
    for ev in evs:
        table = Table(*COLUMNS, title=f"{t.id}: {solution} vs {baseline} on {dev}  (eval {ev.id})")
        for r in rows(ev):
            style = "green" if r["status"] == "ok" else "red"
            table.add_row(*[f"[{style}]{r[c]}[/{style}]" if c == "status" else r[c] for c in COLUMNS])
        console.print(table)
        for res in ev.candidate.results:
            for v in res.violations:
                console.print(f"  [red]integrity[/red] {res.workload}: rule {v.rule}: {v.evidence}")
        console.print(summary(ev))
        console.print(f"harness: {overhead_line(ev.wall_s, ev.timed_s, ev.phases_s)}; stored in {store.path}")
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps([ev.model_dump(mode="json") for ev in evs], indent=1))
    if markdown:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(to_markdown(evs, f"{t.id}: `{solution}` vs `{baseline}`"))
    store.close()
    if not all(ev.candidate.eligible for ev in evs):
        raise typer.Exit(1)


@app.command()
def bench(
    task: str,
    solution: list[str] = typer.Option(..., "--solution", "-s", help="solution name (straightforward, expert, "
                                       "reference), alternative alt:NAME (see `d2k show`) or path (repeatable)"),
    baseline: str = typer.Option("reference", help="the baseline solution (a name, alt:NAME or a path)"),
    workload: Optional[list[str]] = typer.Option(None, "--workload", "-w", help="workload id (repeatable)"),
    device: str = typer.Option("auto", help="auto, cuda or cpu"),
    bar: Optional[list[str]] = typer.Option(None, help="performance bar A/B>=X checked on every workload (repeatable)"),
    bound_bar: Optional[list[str]] = typer.Option(None, "--bound-bar", help="a solution that must meet its workloads' "
                                                  "bound-class bar: memory >= 70% SOL, compute >= 50% SOL, "
                                                  "latency <= 3x launch floor (repeatable)"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="write the result as JSON"),
    markdown: Optional[Path] = typer.Option(None, "--markdown", help="write a markdown page"),
    store_path: Path = typer.Option(None, "--store", help="SQLite results store"),
    timeout: Optional[float] = typer.Option(None, help="seconds per worker request (default: scaled to the workload)"),
    keep_going: bool = typer.Option(False, "--keep-going", help="run every workload even after a timeout or a "
                                    "dead worker"),
) -> None:
    """Time several solutions side by side (interleaved, same inputs) and check performance bars.

    A solution may be one of the task's alternatives (-s alt:NAME, listed by `d2k show`): what a
    user would run instead of writing the kernel (PyTorch SDPA backends, torch.compile of the
    reference), checked like any solution."""
    from rich.markdown import Markdown

    from d2kbench.harness.benchmark import benchmark
    from d2kbench.harness.evaluate import Options, default_workloads, resolve_device
    from d2kbench.report.benchmark import Bar, BoundBar, to_markdown
    from d2kbench.store import DEFAULT_PATH, Store

    t = _task(task)
    try:
        dev = resolve_device(device)
        wls = [t.spec.workload(w) for w in workload] if workload else default_workloads(t, dev)
        _say_skipped(t, dev, bool(workload))
        bars = [Bar.parse(b) for b in bar or []]
        bound_bars = [BoundBar(s) for s in bound_bar or []]
        unknown = [b.solution for b in bound_bars if b.solution not in solution]
        if unknown:
            raise ValueError(f"--bound-bar names {unknown}, which are not among the benchmarked solutions {solution}")
        for s in [*solution, baseline]:
            t.resolve_solution(s, dev)
    except (ValueError, KeyError, FileNotFoundError) as e:
        _refuse(e)
    _warn_slow_on_cpu(t, dev, wls)
    store = Store(store_path or DEFAULT_PATH)
    with console.status(f"benchmarking {', '.join(solution)} vs {baseline} on {t.id} ({dev})") as st:
        res = benchmark(t, list(solution), wls, dev, baseline, store=store,
                        options=Options(timeout_s=timeout, keep_going=keep_going),
                        progress=lambda m: st.update(m))
    store.close()
    page = to_markdown(res, bars, bound_bars)
    console.print(Markdown(page))
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(res.model_dump_json(indent=1))
    if markdown:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(page)
    failed = any(r.status.failed for run in res.runs for r in run.results)
    missed = any(not ok for b in bars for _, _, ok in b.check(res)) or \
        any(not row[-1] for b in bound_bars for row in b.check(res))
    if failed or missed:
        raise typer.Exit(1)


@app.command()
def calibrate(
    task: str,
    workload: Optional[list[str]] = typer.Option(None, "--workload", "-w", help="workload id (repeatable)"),
    device: str = typer.Option("auto", help="auto, cuda or cpu"),
    calls: int = typer.Option(2, min=1, help="fresh input sets per workload (the worst error counts)"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="write the results as JSON"),
    markdown: Optional[Path] = typer.Option(None, "--markdown", help="write a markdown table"),
) -> None:
    """Measure the task's tolerance probes (calibration.py) against its real checks."""
    from rich.markdown import Markdown

    from d2kbench.harness.calibrate import calibrate as run_calibration
    from d2kbench.harness.calibrate import to_markdown, verdicts
    from d2kbench.harness.env import fingerprint
    from d2kbench.harness.evaluate import default_workloads, resolve_device

    t = _task(task)
    try:
        dev = resolve_device(device)
        wls = [t.spec.workload(w) for w in workload] if workload else default_workloads(t, dev)
        with console.status(f"calibrating {t.id} on {dev}"):
            res = run_calibration(t, wls, dev, calls)
    except (ValueError, KeyError, FileNotFoundError) as e:
        _refuse(e)
    page = to_markdown(t, res, fingerprint(dev))
    console.print(Markdown(page))
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps([r.model_dump() for r in res], indent=1))
    if markdown:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(page)
    if not all(ok for _, _, ok in verdicts(res).values()):
        raise typer.Exit(1)


@app.command()
def results(
    task: Optional[str] = typer.Option(None, help="only this task (listed, and merged with --merge)"),
    solution: Optional[str] = typer.Option(None, help="a solution name or sha256 prefix"),
    limit: int = typer.Option(30, help="newest N rows"),
    store_path: Path = typer.Option(None, "--store", help="SQLite results store"),
    merge: Optional[list[Path]] = typer.Option(None, "--merge", help="first bring in everything of another store "
                                               "file (e.g. from a GPU machine): evaluations, runs, candidates, "
                                               "turns, events, verdicts, plans; repeatable"),
) -> None:
    """List recorded evaluation results, newest first."""
    from d2kbench.store import DEFAULT_PATH, Store

    path = store_path or DEFAULT_PATH
    for other in merge or []:
        try:
            target = Store(path)
            n = target.merge(other, task)
            target.close()
        except (FileNotFoundError, ValueError, sqlite3.DatabaseError) as e:
            console.print(f"[red]cannot merge {other}: {e}[/red]")
            raise typer.Exit(2) from None
        added = ", ".join(f"{getattr(n, k)} {k}" for k in ("evaluations", "results", "runs", "candidates", "turns",
                                                            "events", "verdicts", "plans"))
        console.print(f"merged from {other} into {path}: {added}", highlight=False)
        for old, new in n.renamed_runs.items():
            console.print(f"  run {old} is another attempt of the same planned run here: recorded as {new}",
                          highlight=False)
    if not Path(path).exists():
        console.print(f"no results store at {path}")
        raise typer.Exit(1)
    store = Store(path)
    table = Table("id", "recorded", "task", "solution", "sha256", "role", "workload", "device", "status",
                  "mean ms", "cause")
    for r in store.rows(task, solution, limit):
        sol = r["solution"] if len(r["solution"]) <= 36 else "…" + r["solution"][-35:]  # a path: its end
        table.add_row(str(r["id"]), r["recorded_at"], r["task"], sol, r["solution_sha256"][:10], r["role"],
                      r["workload"], r["device"], r["status"], f"{r['mean_ms']:.4f}" if r["mean_ms"] else "-",
                      r["cause"][:50])
    console.print(table)
    store.close()


# The command groups of the other areas, each a module-level typer app in <area>/commands.py,
# added in this order (the order of `d2k --help`).
app.add_typer(report_commands.app)
app.add_typer(agents_commands.app)
app.add_typer(judge_commands.app)
app.add_typer(campaign_commands.app)
app.add_typer(integrity_commands.app)
app.add_typer(judge_commands.judge_app, name="judge")

if __name__ == "__main__":
    app()
