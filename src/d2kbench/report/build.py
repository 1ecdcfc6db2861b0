"""``d2k report``: score a selection of runs and write the paper's tables and figures.

Output folder layout::

    report.md              the main page (Tables 1-6, Figures 3-4, the runs)
    tasks/<task>.md        one page per task (latency per workload, SOL, roofline)
    tables/<key>.csv       every table, raw values
    tables/<key>.notes.txt its notes, one a line (tasks counted as failed, what was left out), when it has any
    figures/*.png          Figures 3 and 4, one latency figure per task
    report.html            every page in one static file, figures embedded (opens offline)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Literal, cast

from d2kbench.report import figures, tables
from d2kbench.report.data import ReportData
from d2kbench.report.document import Page, Section
from d2kbench.report.render import html_page, page_markdown, table_csv
from d2kbench.report.task_pages import figure_path, task_page
from d2kbench.scoring.baseline import BaselineSpec, resolve_baseline
from d2kbench.scoring.runs import ScoreSheet, score_runs
from d2kbench.scoring.trajectory import Trajectory, overall_trajectory, trajectory, turn_grid
from d2kbench.tasks import TaskFileError, load_task
from d2kbench.tasks.schema import TaskSpec

FORMATS = ("md", "csv", "png", "html")


def score(data: ReportData, baseline: BaselineSpec, missing: Literal["error", "fail"] = "error") -> ScoreSheet:
    """Resolve the baseline for the data's tasks and score the selected runs over their
    declared tasks.

    Raises:
        MissingBaselineError / ScoringError: see :func:`d2kbench.scoring.runs.score_runs`.
    """
    base = resolve_baseline(baseline, data.tasks, data.solution_ms(), [*data.pool, *data.runs])
    return score_runs(data.runs, base, data.task_set(), missing, data.left_out)


def trajectories(sheet: ScoreSheet) -> tuple[dict[tuple[str, str], Trajectory], dict[str, Trajectory]]:
    """S'_perf per (model, guidance) over its declared tasks on one shared turn grid, and per
    guidance across models."""
    grid = turn_grid(sheet.runs)
    series: dict[tuple[str, str], Trajectory] = {}
    for g in sheet.groups:
        key = (g.model, g.guidance)
        series[key] = trajectory([r for r in sheet.runs if (r.model, r.guidance) == key], grid, g.tasks)
    overall = {}
    for lv in dict.fromkeys(g.guidance for g in sheet.groups):
        overall[lv] = overall_trajectory({m: t for (m, g), t in series.items() if g == lv})
    return series, overall


def default_specs(task_ids: Iterable[str]) -> dict[str, TaskSpec]:
    """The suite's task specs of ``task_ids`` (tasks not in the suite are left out)."""
    out = {}
    for t in task_ids:
        try:
            out[t] = load_task(t).spec
        except TaskFileError:
            continue
    return out


def _header(data: ReportData, sheet: ScoreSheet) -> list[str]:
    env = data.env
    h = [f"store: `{data.store}`; hardware: {data.hardware}"]
    machine = ", ".join(f"{k} {env[k]}" for k in ("gpu", "driver", "cuda_runtime", "torch", "triton") if env.get(k))
    if machine:
        h.append(f"machine (newest evaluation): {machine}")
    h.append(f"baseline: {sheet.baseline.spec.describe()}")
    sources = sorted({g.task_source for g in sheet.groups if g.task_source})
    h.append(f"selection: {data.selection.describe()}; runs: {len(data.runs)}, models: {len(sheet.models())}, "
             f"declared tasks: {len(data.tasks)}" + (f" (from {'; '.join(sources)})" if sources else ""))
    if sheet.no_baseline:
        h.append("NO BASELINE, counted as failed in every score: "
                 + "; ".join(f"{t} ({why})" for t, why in sheet.no_baseline.items()))
    note = sheet.missing_note()
    if note:
        h.append(note[0].upper() + note[1:])
    if sheet.outside:
        h.append("not scored (task not declared): " + "; ".join(f"{r} ({why})" for r, why in sheet.outside.items()))
    if data.borrowed:
        h.append("counted for the selected campaigns' plans, filed under another campaign (same experiment): "
                 + "; ".join(f"{r} ({c})" for r, c in data.borrowed.items()))
    if data.skipped:
        h.append("left out: " + "; ".join(f"{r} ({why})" for r, why in data.skipped.items()))
    if data.incomplete_evaluations:
        h.append("evaluations left out (not complete): "
                 + ", ".join(f"{n} {st}" for st, n in data.incomplete_evaluations.items()))
    for rid, cands in data.incomplete_candidates.items():
        h.append(f"run {rid}: candidates left out (evaluation not complete): {'; '.join(cands)}")
    for rid, ids in data.held_back_copies.items():
        h.append(f"run {rid}: candidates excluded from every score as copies of held-back solutions: "
                 + ", ".join(f"#{i}" for i in ids))
    return h


def page_tasks(data: ReportData, sheet: ScoreSheet) -> list[str]:
    """The tasks that get a page: declared tasks with a scored run or task-solution timings."""
    have = {r.task for r in sheet.runs} | set(data.solutions)
    return [t for t in data.tasks if t in have]


def build_pages(data: ReportData, sheet: ScoreSheet, specs: Mapping[str, TaskSpec], with_figures: bool,
                out_dir: Path) -> tuple[list[tuple[str, Page]], list[Path]]:
    """(path relative to ``out_dir``, page) of the main page and every task page, and the
    figures written under ``out_dir/figures`` (only with ``with_figures``)."""
    main = Page(slug="report", title="D2K-Bench report", header=_header(data, sheet))
    written: list[Path] = []
    if sheet.groups:
        series, overall = trajectories(sheet)
        levels = tables.levels_present(sheet)
        ablation = tables.ablation_table(sheet)
        t6, t6b = tables.table6(data)
        fig3 = fig4 = None
        footnote = sheet.missing_summary()
        if with_figures:
            # ablation_table's rows: the model, then S_perf (a float, or None) per level
            scores = cast("dict[str, dict[str, float | None]]",
                          {row[0]: dict(zip(levels, row[1:])) for row in ablation.rows[:-1]})
            fig3, fig4 = "figures/fig3_ablation.png", "figures/fig4_trajectory.png"
            written.append(figures.ablation_figure(scores, levels, out_dir / fig3, footnote))
            written.append(figures.trajectory_figure(series, overall, out_dir / fig4, footnote))
        fig_note = [f"In the figure: {footnote}"] if footnote and with_figures else []
        main.sections = [
            Section(title="Table 1: correctness and S_perf",
                    tables=[tables.table1(sheet), tables.solutions_table(sheet, data)]),
            Section(title="Table 2: judge scores", tables=[tables.table2(sheet, data)]),
            Section(title="Figure 3: cumulative guidance ablation", tables=[ablation], figure=fig3,
                    caption="S_perf per model under none, L1, L1+L2, L1+L2+L3", text=fig_note),
            Section(title="Table 4: fully-correct models", tables=[tables.table4(sheet)]),
            Section(title="Table 5: fast_p", tables=[tables.table5(sheet)]),
            Section(title="Figure 4: trajectory score", tables=tables.trajectory_tables(series, overall, sheet), figure=fig4,
                    caption="S'_perf over turns (one colour per guidance setting; thick: all models)",
                    text=["A task counts 0.1 until its first correct submission, then its best correct speedup so "
                          "far (below 0.1 as measured); geometric mean over tasks, then over models."] + fig_note),
            Section(title="Table 6: tokens and cost", tables=[t6, t6b]),
            Section(title="Runs", tables=[tables.run_table(sheet)]),
        ]
    else:
        main.sections = [Section(title="Agent runs", text=[
            "The selection holds no agent runs: only the task pages, built from the task solutions' results."])]
    pages = []
    listed = page_tasks(data, sheet)
    for task in listed:
        fig = figure_path(task) if with_figures else None
        tp = task_page(task, data, sheet, specs.get(task), fig)
        if fig:
            written.append(figures.latency_figure(task, tp.workloads, tp.latencies, tp.bounds, out_dir / fig))
        pages.append((f"tasks/{task}.md", tp.page))
    main.sections.append(Section(title="Task pages", text=[
        "\n".join(f"- [{task}](tasks/{task}.md)" for task in listed) or "No tasks."]))
    return [("report.md", main), *pages], written


def build_report(data: ReportData, baseline: BaselineSpec, out_dir: Path, formats: Iterable[str] = FORMATS,
                 missing: Literal["error", "fail"] = "error",
                 specs: Mapping[str, TaskSpec] | None = None) -> list[Path]:
    """Score ``data`` against ``baseline`` and write the report under ``out_dir``.

    Args:
        formats: any of ``md``, ``csv``, ``png``, ``html`` (html needs the figures, so it writes
            the PNG files too).
        missing: what to do with a task the baseline has no latencies for (``error``, or
            ``fail``: it counts as failed in every score and the header says so).
        specs: task id -> spec, for SOL figures (default: the suite's task files).

    Returns the written files.

    Raises:
        ValueError: an unknown format. MissingBaselineError / ScoringError: see :func:`score`.
    """
    formats = set(formats)
    unknown = formats - set(FORMATS)
    if unknown or not formats:
        raise ValueError(f"unknown report format(s) {sorted(unknown)} (choose from {', '.join(FORMATS)})")
    with_figures = bool(formats & {"png", "html"})
    if with_figures:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ValueError("png and html reports need matplotlib: pip install 'd2kbench[report]' "
                             "(or choose --format md / csv)") from None
    sheet = score(data, baseline, missing)
    specs = default_specs(page_tasks(data, sheet)) if specs is None else specs
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    pages, written = build_pages(data, sheet, specs, with_figures, out_dir)
    texts = [(path, page_markdown(page, path)) for path, page in pages]
    if "md" in formats:
        for path, text in texts:
            (out_dir / path).parent.mkdir(parents=True, exist_ok=True)
            (out_dir / path).write_text(text)
            written.append(out_dir / path)
    if "csv" in formats:
        (out_dir / "tables").mkdir(exist_ok=True)
        for _, page in pages:
            for sec in page.sections:
                for t in sec.tables:
                    (out_dir / "tables" / f"{t.key}.csv").write_text(table_csv(t))
                    written.append(out_dir / "tables" / f"{t.key}.csv")
                    if t.notes:  # a CSV has no place for them; a table never travels without them
                        (out_dir / "tables" / f"{t.key}.notes.txt").write_text("\n".join(t.notes) + "\n")
                        written.append(out_dir / "tables" / f"{t.key}.notes.txt")
    if "html" in formats:
        (out_dir / "report.html").write_text(html_page(texts, out_dir, "D2K-Bench report"))
        written.append(out_dir / "report.html")
    return written
