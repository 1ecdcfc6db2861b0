"""Per-task pages: latency per workload of the task solutions and of each run's final candidate,
speedups against the baseline, and SOL / roofline figures (docs/timing.md, "Speed of light (SOL) and the roofline")."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from d2kbench.report.data import ReportData
from d2kbench.report.document import Column, Page, Section, Table
from d2kbench.report.tables import runs_by_task
from d2kbench.scoring.baseline import SOLUTION_BASELINES
from d2kbench.scoring.metrics import ScoringError, task_speedup
from d2kbench.scoring.records import guidance_rank
from d2kbench.scoring.roofline import SOL_VIOLATION_TOLERANCE, roofline, sol_bounds
from d2kbench.scoring.runs import ScoreSheet
from d2kbench.scoring.sol import DATASHEET, gpu_key
from d2kbench.scoring.speedup import speedup
from d2kbench.tasks.schema import TaskSpec

MS, PCT_1 = ".4f", ".1%"


def _series(task: str, data: ReportData, sheet: ScoreSheet) -> list[tuple[str, str, dict[str, float | str]]]:
    """(label, source, workload -> latency ms or a failure word) of each solution and final candidate."""
    out = []
    for sol in SOLUTION_BASELINES:
        timings = data.solutions.get(task, {}).get(sol)
        if timings:
            n = min(v.n_ok for v in timings.values())
            cells = {w: v.mean_ms if v.mean_ms is not None else f"FAILED ({v.last_status})" for w, v in timings.items()}
            out.append((sol, f"task solution {next(iter(timings.values())).sha256[:10]}, {n} evaluation(s)", cells))
    cands = {(r.run_id, c.id): c for r in data.runs for c in r.candidates}
    for r in sorted(runs_by_task(sheet).get(task, []), key=lambda r: (r.model, guidance_rank(r.guidance), r.run_id)):
        label = f"{r.model} / {r.guidance}"
        if r.final_candidate is None:
            out.append((label, f"run {r.run_id}: no correct submission", {}))
        else:
            lat = cands[(r.run_id, r.final_candidate)].latencies_ms
            out.append((label, f"run {r.run_id}, candidate {r.final_candidate} (turn {r.final_turn})", dict(lat)))
    return out


class TaskPage(NamedTuple):
    """A task page and the inputs of its latency figure: the workloads, label -> workload ->
    latency ms, and workload -> (reference-derived SOL ms, floor SOL ms)."""

    page: Page
    workloads: list[str]
    latencies: dict[str, dict[str, float]]
    bounds: dict[str, tuple[float, float]]


def task_page(task: str, data: ReportData, sheet: ScoreSheet, spec: TaskSpec | None,
              figure: str | None = None) -> TaskPage:
    """The page of one task and the inputs of its latency figure.

    Args:
        figure: the figure's path relative to the report folder (None: no figure section).
    """
    base = sheet.baseline.latencies_ms.get(task)
    series = _series(task, data, sheet)
    workloads = sorted(base) if base else sorted({w for _, _, lat in series for w in lat})
    if spec:  # the task file's order
        order = {w.id: i for i, w in enumerate(spec.all_workloads())}
        workloads.sort(key=lambda w: (order.get(w, len(order)), w))
    header = [f"hardware: {data.hardware}"]
    if base:
        source = "" if sheet.baseline.spec.kind == "solution" else f" ({sheet.baseline.sources[task]})"
        header.append(f"baseline: {sheet.baseline.spec.describe()}{source}")
    else:
        why = sheet.no_baseline.get(task) or sheet.baseline.missing.get(task, "not resolved")
        header.append(f"baseline: {sheet.baseline.spec.describe()}: none for this task ({why})")
    header.append(f"timed workloads: {', '.join(workloads) or 'none recorded'}")
    left = data.incomplete_by_task.get(task)
    if left:
        header.append("evaluations of this task left out (not complete): "
                      + ", ".join(f"{n} {st}" for st, n in sorted(left.items())))
    title = f"Task {task}" + (f": {spec.title}" if spec else "")
    page = Page(slug=task, title=title, header=header)

    lat_table = Table(key=f"{task}_latency", title="Latency per workload (ms, per-call mean) and task speedup",
                      columns=[Column(name="solution"), Column(name="source")]
                      + [Column(name=w, fmt=MS) for w in workloads] + [Column(name="geomean speedup", fmt=".3f")])
    numeric: dict[str, dict[str, float]] = {}
    for label, source, cells in series:
        lat = {w: v for w, v in cells.items() if isinstance(v, float)}
        numeric[label] = lat
        sp = None
        if base and cells and len(lat) == len(cells):
            try:
                sp = task_speedup(base, lat, task)
            except ScoringError as e:
                lat_table.notes.append(f"{label}: no speedup: {e}")
        lat_table.rows.append([label, source] + [cells.get(w) for w in workloads] + [sp])
    sections = [Section(title="Latency", tables=[lat_table])]

    bounds: dict[str, tuple[float, float]] = {}
    hw = gpu_key(data.hardware)
    if spec is None:
        sections.append(Section(title="Speed of light", text=["The task is not in the suite: no SOL counts."]))
    elif hw not in DATASHEET:
        sections.append(Section(title="Speed of light",
                                text=[f"No ceiling table for hardware {data.hardware!r}: no SOL figures."]))
    else:
        sections.append(_sol_section(task, spec, hw, workloads, numeric, base or {}, bounds))
    if figure:
        sections.append(Section(title="Figure", figure=figure,
                                caption=f"{task}: latency per workload with SOL bounds"))
    page.sections = sections
    return TaskPage(page, workloads, numeric, bounds)


def _sol_section(task: str, spec: TaskSpec, hw: str, workloads: list[str], numeric: dict[str, dict[str, float]],
                 base: dict[str, float], bounds: dict[str, tuple[float, float]]) -> Section:
    sheet = DATASHEET[hw]
    floor = spec.sol.floor
    sol_t = Table(key=f"{task}_sol", title=f"SOL per workload on {hw} (ms)", columns=[
        Column(name="workload"), Column(name="axes"), Column(name="reference work", fmt=MS), Column(name="bound"),
        Column(name=f"floor ({floor})", fmt=MS), Column(name="floor bound"),
        Column(name="floor, measured ceilings", fmt=MS)])
    roof_t = Table(key=f"{task}_roofline", title="Roofline per solution and workload", columns=[
        Column(name="solution"), Column(name="workload"), Column(name="latency ms", fmt=MS),
        Column(name="speedup", fmt=".3f"), Column(name="utilisation", fmt=PCT_1),
        Column(name="utilisation, measured ceilings", fmt=PCT_1), Column(name="gap closed", fmt=PCT_1),
        Column(name="flags")])
    axes_of = {}
    for w in workloads:
        try:
            axes_of[w] = spec.workload(w).axes
        except KeyError:
            sol_t.notes.append(f"workload {w!r} is not registered in the task file: no SOL figures for it.")
    for w, axes in axes_of.items():
        b = sol_bounds(spec.sol, axes, hw)
        bounds[w] = (b.sol_reference_ms, b.sol_floor_ms)
        sol_t.rows.append([w, ", ".join(f"{k}={v}" for k, v in axes.items()), b.sol_reference_ms, b.reference_bound,
                           b.sol_floor_ms, b.floor_bound, b.sol_floor_measured_ms])
    for label, lat in numeric.items():
        for w in workloads:
            if w not in lat or w not in axes_of:
                continue
            r = roofline(spec.sol, axes_of[w], lat[w], hw, base.get(w))
            flags = [f for f, on in (("beats reference-derived bound", r.beats_reference_bound),
                                     ("SOL VIOLATION", r.sol_violation)) if on]
            roof_t.rows.append([label, w, lat[w], speedup(base[w], lat[w]) if w in base else None, r.utilisation,
                                r.utilisation_measured, r.gap_closed, "; ".join(flags)])
    roof_t.notes += [
        f"utilisation = SOL floor ({floor}: the least work of any known design) / latency, datasheet ceilings; "
        "gap closed = (baseline - latency) / (baseline - SOL floor).",
        "beats reference-derived bound: faster than the reference algorithm's work allows, which only a design "
        "that removes work can be (allowed, not rewarded).",
        f"SOL VIOLATION: more than {SOL_VIOLATION_TOLERANCE:.0%} under the floor; physically implausible "
        "(a counting bug, L2 residency or cheating).",
    ]
    return Section(title="Speed of light", text=[f"Ceilings: {sheet.source}."], tables=[sol_t, roof_t])



def figure_path(task: str) -> str:
    """Where a task's figure goes, relative to the report folder."""
    return str(Path("figures") / f"task_{task}.png")
