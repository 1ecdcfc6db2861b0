"""``d2k score`` and ``d2k report``: scores and the paper's tables and figures from the store."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table as RichTable

from d2kbench.terminal import print_error

# Imports inside functions: `d2k --help` and each command load only what that command needs (torch, the
# harness, provider SDKs): start-up time.

console = Console()

_MISSING = ("error", "fail")


def _print_table(table) -> None:
    """Print a report table with rich, its notes below it."""
    from d2kbench.report.render import cell_text

    rt = RichTable(*[c.name for c in table.columns], title=table.title)
    for row in table.rows:
        rt.add_row(*[cell_text(v, c) for v, c in zip(row, table.columns)])
    console.print(rt)
    for n in table.notes:
        console.print(f"  {n}", markup=False, highlight=False)


def _load(store_path: Path | None, baseline: str, campaign, task, model, guidance, seed, hardware):
    """(data, baseline spec) for the options, or a clean exit with the cause."""
    from d2kbench.report.data import Selection, load
    from d2kbench.scoring.baseline import parse_baseline
    from d2kbench.scoring.metrics import ScoringError
    from d2kbench.store import DEFAULT_PATH, Store

    path = Path(store_path or DEFAULT_PATH)
    if not path.is_file():
        console.print(f"[red]no results store at {path}[/red]")
        raise typer.Exit(2)
    try:
        spec = parse_baseline(baseline)
    except ValueError as e:
        print_error(console, e)
        raise typer.Exit(2) from None
    store = Store(path)
    try:
        data = load(store, Selection(campaigns=campaign or None, tasks=task or None, models=model or None,
                                     guidance=guidance or None, seeds=seed or None), hardware, spec)
    except ScoringError as e:
        print_error(console, e)
        raise typer.Exit(2) from None
    finally:
        store.close()
    return data, spec


def _check_missing(missing: str) -> None:
    if missing not in _MISSING:
        console.print(f"[red]--missing-baseline must be one of {', '.join(_MISSING)}, got {missing!r}[/red]")
        raise typer.Exit(2)


def _scoring_failed(e: Exception) -> None:
    from d2kbench.scoring.metrics import MissingBaselineError

    console.print(str(e), style="red", markup=False, highlight=False)
    if isinstance(e, MissingBaselineError):
        console.print("pass --missing-baseline fail to count these tasks as failed in every score (the output says so)")
    raise typer.Exit(2) from None


_STORE = typer.Option(None, "--store", help="SQLite results store (default ./d2k.sqlite or $D2K_STORE)")
_BASELINE = typer.Option("reference", help="reference, expert, straightforward, run:<run_id>, or model:<name> "
                                           "(that model's first correct unguided submission: the paper's baseline)")
_CAMPAIGN = typer.Option(None, "--campaign", help="only runs of this campaign (repeatable)")
_TASK = typer.Option(None, "--task", help="only this task (repeatable)")
_MODEL = typer.Option(None, "--model", help="only this model (repeatable)")
_GUIDANCE = typer.Option(None, "--guidance", help="only this guidance: none, L1, L1+L2, L1+L2+L3, design (repeatable)")
_SEED = typer.Option(None, "--seed", help="only this seed (repeatable)")
_HARDWARE = typer.Option(None, "--hardware", help="use results of this machine (H200, B200, cpu, ...); "
                                                  "needed when the store holds several")
_MISSING_OPT = typer.Option("error", "--missing-baseline",
                            help="a task without baseline timings: error, or fail (it counts as a failed task in "
                                 "every score; the output says how many)")


#: ``score`` and ``report``: a typer app whose commands :mod:`d2kbench.cli` adds to ``d2k``.
app = typer.Typer()


@app.command()
def score(
    store_path: Optional[Path] = _STORE,
    baseline: str = _BASELINE,
    campaign: Optional[list[str]] = _CAMPAIGN,
    task: Optional[list[str]] = _TASK,
    model: Optional[list[str]] = _MODEL,
    guidance: Optional[list[str]] = _GUIDANCE,
    seed: Optional[list[int]] = _SEED,
    hardware: Optional[str] = _HARDWARE,
    missing_baseline: str = _MISSING_OPT,
    json_path: Optional[Path] = typer.Option(None, "--json", help="write the full score sheet as JSON"),
) -> None:
    """Print S_perf, fast_p and every run's final candidate for a selection of runs."""
    from d2kbench.report import build, tables
    from d2kbench.scoring.metrics import ScoringError

    _check_missing(missing_baseline)
    data, spec = _load(store_path, baseline, campaign, task, model, guidance, seed, hardware)
    try:
        sheet = build.score(data, spec, missing_baseline)  # type: ignore[arg-type]
    except ScoringError as e:
        _scoring_failed(e)
    console.print(f"hardware {data.hardware}; baseline: {spec.describe()}; selection: {data.selection.describe()}")
    for t, why in sheet.no_baseline.items():
        console.print(f"[yellow]no baseline, counted as failed[/yellow] {t}: {why}")
    for rid, campaign in data.borrowed.items():
        console.print(f"counted: {rid} (filed under campaign {campaign}; the same experiment as a planned run)",
                      markup=False, highlight=False)
    for rid, why in data.skipped.items():
        console.print(f"left out: {rid} ({why})", markup=False, highlight=False)
    for rid, why in sheet.outside.items():
        console.print(f"not scored: {rid} ({why})", markup=False, highlight=False)
    for st, n in data.incomplete_evaluations.items():
        console.print(f"left out: {n} evaluation(s) {st} (reports use complete evaluations only)",
                      markup=False, highlight=False)
    for rid, cands in data.incomplete_candidates.items():
        console.print(f"left out of run {rid} (evaluation not complete): {'; '.join(cands)}",
                      markup=False, highlight=False)
    for rid, ids in data.held_back_copies.items():
        console.print(f"excluded: run {rid} candidates {', '.join(f'#{i}' for i in ids)} (copies of held-back "
                      "solutions)", markup=False, highlight=False)
    if not sheet.groups:
        console.print("no finished agent runs in this selection")
    else:
        _print_table(tables.run_table(sheet))
        _print_table(tables.group_table(sheet))
        usage, _ = tables.table6(data)
        warnings = [n for n in usage.notes if n.startswith("cost unknown")]
        usage.notes = [n for n in usage.notes if n not in warnings]
        _print_table(usage)
        for n in warnings:
            console.print(f"[yellow]warning:[/yellow] {n}", highlight=False)
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(sheet.model_dump_json(indent=1))
        console.print(f"wrote {json_path}")

@app.command()
def report(
    store_path: Optional[Path] = _STORE,
    out: Path = typer.Option(Path("report"), "--out", "-o", help="output folder"),
    baseline: str = _BASELINE,
    campaign: Optional[list[str]] = _CAMPAIGN,
    task: Optional[list[str]] = _TASK,
    model: Optional[list[str]] = _MODEL,
    guidance: Optional[list[str]] = _GUIDANCE,
    seed: Optional[list[int]] = _SEED,
    hardware: Optional[str] = _HARDWARE,
    missing_baseline: str = _MISSING_OPT,
    fmt: Optional[list[str]] = typer.Option(None, "--format", "-f",
                                            help="md, csv, png, html (repeatable; default: all)"),
) -> None:
    """Write the paper's tables and figures, and one page per task, from the results store.

    Markdown (report.md, tasks/*.md), CSV (tables/*.csv), PNG (figures/*.png) and one
    static HTML page (report.html, figures embedded) under --out.
    """
    from d2kbench.report.build import FORMATS, build_report

    _check_missing(missing_baseline)
    formats = fmt or list(FORMATS)
    bad = sorted(set(formats) - set(FORMATS))
    if bad:
        console.print(f"[red]unknown format(s) {', '.join(bad)} (choose from {', '.join(FORMATS)})[/red]")
        raise typer.Exit(2)
    data, spec = _load(store_path, baseline, campaign, task, model, guidance, seed, hardware)
    try:
        files = build_report(data, spec, out, formats, missing_baseline)  # type: ignore[arg-type]
    except ValueError as e:  # ScoringError included; also a missing matplotlib
        _scoring_failed(e)
    console.print(f"runs: {len(data.runs)}, tasks: {len(data.tasks)}, hardware: {data.hardware}; "
                  f"baseline: {spec.describe()}")
    for f in files:
        console.print(f"  {f}", markup=False, highlight=False)
