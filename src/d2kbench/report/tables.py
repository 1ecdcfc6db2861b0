"""The paper's tables, built from a :class:`ScoreSheet` and the store's data (SPEC.md sections 3-5).

Each builder returns a :class:`Table` of raw values. Columns named ``none`` and ``L1+L2+L3``
are the unguided and the fully guided settings of the paired runs.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from d2kbench.report.data import ReportData, Usage
from d2kbench.report.document import Column, Table
from d2kbench.scoring.baseline import SOLUTION_BASELINES
from d2kbench.scoring.metrics import FAST_P_THRESHOLDS, ScoringError, performance_score, task_speedup
from d2kbench.scoring.records import DESIGN, GUIDED, UNGUIDED, guidance_rank
from d2kbench.scoring.runs import RunScore, ScoreSheet
from d2kbench.scoring.speedup import geomean
from d2kbench.scoring.trajectory import Trajectory

PCT, SCORE, REL = ".1%", ".3f", "+.1%"


def _rel(new: float | None, old: float | None) -> float | None:
    return new / old - 1.0 if new is not None and old else None


def levels_present(sheet: ScoreSheet) -> list[str]:
    """Guidance settings present, in ablation order (unknown ones last, sorted)."""
    return sorted({g.guidance for g in sheet.groups}, key=guidance_rank)


def table1(sheet: ScoreSheet) -> Table:
    """Table 1: per model, correctness over tasks and S_perf unguided vs guided, and the relative
    change of S_perf; the last row pools model-task pairs (correctness) and takes the overall
    S_perf (geometric mean over models)."""
    t = Table(key="table1_correctness_sperf", title="Table 1: correctness and Performance Score S_perf",
              columns=[Column(name="model"), Column(name="tasks none", fmt="d"), Column(name="tasks L1+L2+L3", fmt="d"),
                       Column(name="correct none", fmt=PCT), Column(name="correct L1+L2+L3", fmt=PCT),
                       Column(name="S_perf none", fmt=SCORE), Column(name="S_perf L1+L2+L3", fmt=SCORE),
                       Column(name="change", fmt=REL)])
    pairs = {UNGUIDED: [0, 0], GUIDED: [0, 0]}
    for m in sheet.models():
        u, g = sheet.group(m, UNGUIDED), sheet.group(m, GUIDED)
        for key, grp in ((UNGUIDED, u), (GUIDED, g)):
            if grp:
                pairs[key][0] += grp.n_correct
                pairs[key][1] += grp.n_tasks
        t.rows.append([m, u.n_tasks if u else None, g.n_tasks if g else None,
                       u.n_correct / u.n_tasks if u else None, g.n_correct / g.n_tasks if g else None,
                       u.s_perf if u else None, g.s_perf if g else None,
                       _rel(g.s_perf if g else None, u.s_perf if u else None)])
    ou, og = sheet.overall(UNGUIDED), sheet.overall(GUIDED)
    t.rows.append(["all models", pairs[UNGUIDED][1] or None, pairs[GUIDED][1] or None,
                   pairs[UNGUIDED][0] / pairs[UNGUIDED][1] if pairs[UNGUIDED][1] else None,
                   pairs[GUIDED][0] / pairs[GUIDED][1] if pairs[GUIDED][1] else None, ou, og, _rel(og, ou)])
    n_all = len({r.task for r in sheet.runs})
    partial = [f"{g.model} / {g.guidance} ({g.n_tasks} of {n_all})" for g in sheet.groups if g.n_tasks != n_all]
    if partial:
        t.notes.append("runs for only some tasks, scored over those tasks only: " + ", ".join(partial) + ".")
    t.notes.append("correct: share of tasks whose final submission passed every check; S_perf: geometric mean "
                   "over tasks of the task speedup, 0.5 for a failed task; all models: model-task pairs pooled, "
                   "S_perf as the geometric mean over models (SPEC.md section 3).")
    return t


def solutions_table(sheet: ScoreSheet, data: ReportData) -> Table:
    """Table 1b: S_perf of the task solutions against the same baseline, over the tasks they
    were timed on (a task solution with a failed workload counts as a failed task)."""
    t = Table(key="table1b_task_solutions", title="Table 1b: the task solutions against the same baseline",
              columns=[Column(name="solution"), Column(name="tasks", fmt="d"), Column(name="correct", fmt=PCT),
                       Column(name="S_perf", fmt=SCORE)])
    base = sheet.baseline.latencies_ms
    for sol in SOLUTION_BASELINES:
        speedups: dict[str, float | None] = {}
        for task in data.tasks:
            timings = data.solutions.get(task, {}).get(sol)
            if not timings or task not in base or task in sheet.excluded:
                continue
            if any(v.mean_ms is None for v in timings.values()):
                speedups[task] = None
                continue
            try:
                speedups[task] = task_speedup(base[task], {w: v.mean_ms for w, v in timings.items()}, task)
            except ScoringError as e:
                t.notes.append(f"{sol} left out on {task}: {e}")
        if speedups:
            ok = sum(s is not None for s in speedups.values())
            t.rows.append([sol, len(speedups), ok / len(speedups), performance_score(speedups)])
    return t


def _median_js(verdicts, kind: str, targets: set[str]) -> float | None:
    js = [v.js for v in verdicts if v.kind == kind and v.target in targets]
    return statistics.median(js) if js else None


def table2(sheet: ScoreSheet, data: ReportData) -> Table:
    """Table 2: judge scores beside S_perf, per model (SPEC.md section 5).

    JS_impl of a run: the median ``js`` of the ``impl`` verdicts whose target is the run id or
    its final candidate's sha256; 0 for a run without a correct submission (incorrect
    submissions score 0). JS_design: the median ``design`` verdict of each independent-design
    run (target = run id). Per model, the arithmetic mean over the judged tasks; ``judged``
    counts them per column.
    """
    t = Table(key="table2_judge", title="Table 2: judge scores (0-100) beside S_perf",
              columns=[Column(name="model"), Column(name="JS_design", fmt=".1f"),
                       Column(name="JS_impl none", fmt=".1f"), Column(name="JS_impl L1+L2+L3", fmt=".1f"),
                       Column(name="S_perf none", fmt=SCORE), Column(name="S_perf L1+L2+L3", fmt=SCORE),
                       Column(name="judged (design / none / guided)")])
    by_model: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    totals: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in sheet.runs:
        if r.guidance not in (UNGUIDED, GUIDED):
            continue
        totals[r.model][r.guidance] += 1
        js = 0.0 if not r.correct else _median_js(data.verdicts, "impl", {r.run_id, r.final_sha256})
        if js is not None:
            by_model[r.model][r.guidance].append(js)
    for run in data.runs:
        if run.guidance == DESIGN:
            totals[run.model][DESIGN] += 1
            js = _median_js(data.verdicts, "design", {run.run_id})
            if js is not None:
                by_model[run.model][DESIGN].append(js)
    mean = lambda xs: statistics.fmean(xs) if xs else None  # noqa: E731
    for m in sorted(set(totals)):
        u, g = sheet.group(m, UNGUIDED), sheet.group(m, GUIDED)
        judged = " / ".join(f"{len(by_model[m][k])}/{totals[m][k]}" for k in (DESIGN, UNGUIDED, GUIDED))
        t.rows.append([m, mean(by_model[m][DESIGN]), mean(by_model[m][UNGUIDED]), mean(by_model[m][GUIDED]),
                       u.s_perf if u else None, g.s_perf if g else None, judged])
    known = {r.run_id for r in data.runs} | {r.final_sha256 for r in sheet.runs if r.final_sha256}
    stray = [v for v in data.verdicts if v.target not in known]
    if stray:
        t.notes.append(f"{len(stray)} verdict(s) match no selected run or final candidate and are not counted.")
    return t


def ablation_table(sheet: ScoreSheet) -> Table:
    """Figure 3 data: S_perf per model at each cumulative guidance level, and overall."""
    levels = levels_present(sheet)
    t = Table(key="figure3_ablation", title="Figure 3 data: S_perf under cumulative guidance",
              columns=[Column(name="model")] + [Column(name=lv, fmt=SCORE) for lv in levels])
    for m in sheet.models():
        t.rows.append([m] + [(g.s_perf if (g := sheet.group(m, lv)) else None) for lv in levels])
    t.rows.append(["all models (geomean)"] + [sheet.overall(lv) for lv in levels])
    return t


def table4(sheet: ScoreSheet) -> Table:
    """Table 4: geometric-mean speedup over tasks for the models whose final submissions are
    correct on every task both unguided and guided (no 0.5 penalty enters); the last row is the
    geometric mean over those models."""
    t = Table(key="table4_fully_correct", title="Table 4: geometric-mean speedup of fully-correct models",
              columns=[Column(name="model"), Column(name="tasks", fmt="d"), Column(name="none", fmt=SCORE),
                       Column(name="L1+L2+L3", fmt=SCORE), Column(name="change", fmt=REL)])
    rows = []
    for m in sheet.models():
        u, g = sheet.group(m, UNGUIDED), sheet.group(m, GUIDED)
        if u and g and u.geomean_speedup is not None and g.geomean_speedup is not None:
            gu, gg = u.geomean_speedup, g.geomean_speedup
            rows.append([m, u.n_tasks, gu, gg, _rel(gg, gu)])
    t.rows += rows
    if rows:
        gu, gg = geomean(r[2] for r in rows), geomean(r[3] for r in rows)
        t.rows.append([f"{len(rows)} fully-correct model(s)", None, gu, gg, _rel(gg, gu)])
    else:
        t.notes.append("no model is correct on every task in both settings.")
    return t


def table5(sheet: ScoreSheet) -> Table:
    """Table 5: fast_p per model and guidance (share of all tasks with task speedup > p)."""
    t = Table(key="table5_fast_p", title="Table 5: fast_p (share of all tasks, failed ones included, faster than p)",
              columns=[Column(name="model"), Column(name="guidance"), Column(name="tasks", fmt="d")]
              + [Column(name=f"fast_{p:g}", fmt=PCT) for p in FAST_P_THRESHOLDS])
    for m in sheet.models():
        for lv in levels_present(sheet):
            if g := sheet.group(m, lv):
                t.rows.append([m, lv, g.n_tasks] + [g.fast_p[p] for p in FAST_P_THRESHOLDS])
    return t


def trajectory_tables(series: dict[tuple[str, str], Trajectory], overall: dict[str, Trajectory]) -> list[Table]:
    """Figure 4 data: S'_perf at a quarter, half, three quarters and the end of the turn grid per
    (model, guidance) and across models; and every turn in long form (CSV only)."""
    rows = [*series.items(), *((("all models", lv), t) for lv, t in overall.items())]
    grid = rows[0][1].turns if rows else [0]
    marks = sorted({grid[min(len(grid) - 1, round(q * (len(grid) - 1)))] for q in (0.25, 0.5, 0.75, 1.0)})
    t = Table(key="figure4_trajectory", title="Figure 4 data: trajectory score S'_perf by turn",
              columns=[Column(name="model"), Column(name="guidance")]
              + [Column(name=f"turn {m}", fmt=SCORE) for m in marks])
    full = Table(key="figure4_trajectory_all_turns", title="Figure 4 data, every turn", markdown=False,
                 columns=[Column(name="model"), Column(name="guidance"), Column(name="turn"),
                          Column(name="S'_perf", fmt=SCORE)])
    for (model, lv), traj in rows:
        at = dict(zip(traj.turns, traj.values))
        t.rows.append([model, lv] + [at[m] for m in marks])
        full.rows += [[model, lv, turn, v] for turn, v in zip(traj.turns, traj.values)]
    return [t, full]


def _usage_row(label: str, guidance: str, runs: int, u: Usage) -> list:
    return [label, guidance, runs, u.input_tokens, u.output_tokens, u.cache_read, u.cache_write, u.cost_usd]


def table6(data: ReportData) -> tuple[Table, Table]:
    """Table 6: token usage and estimated API cost per model and guidance (summed over runs),
    totals per guidance, and the relative change of the totals from unguided to guided."""
    cols = [Column(name="model"), Column(name="guidance"), Column(name="runs", fmt="d"), Column(name="input", fmt=","),
            Column(name="output", fmt=","), Column(name="cache read", fmt=","), Column(name="cache write", fmt=","),
            Column(name="cost USD", fmt=",.2f")]
    t = Table(key="table6_tokens", title="Table 6: tokens and estimated API cost", columns=cols)
    sums: dict[tuple[str, str], Usage] = {}
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for run in data.runs:
        u = data.usage.get(run.run_id, Usage())
        for key in ((run.model, run.guidance), ("all models", run.guidance)):
            s = sums.setdefault(key, Usage())
            counts[key] += 1
            for f in ("turns", "input_tokens", "output_tokens", "cache_read", "cache_write", "cost_usd"):
                setattr(s, f, getattr(s, f) + getattr(u, f))
    for (m, lv) in sorted(sums, key=lambda k: (k[0] == "all models", k[0], guidance_rank(k[1]))):
        t.rows.append(_usage_row(m, lv, counts[(m, lv)], sums[(m, lv)]))
    change = Table(key="table6b_token_change", title="Table 6b: change of the totals from unguided to guided",
                   columns=[Column(name=c, fmt=REL) for c in ("input", "output", "cache read", "cache write", "cost")])
    left = data.skipped_usage
    if left.turns:
        t.notes.append(f"not in the table: {left.turns} turns of left-out runs (still running, interrupted or "
                       f"superseded attempts): {left.input_tokens:,} input, {left.output_tokens:,} output, "
                       f"{left.cache_read:,} cache-read, {left.cache_write:,} cache-write tokens, "
                       f"US${left.cost_usd:,.2f}.")
    a, b = sums.get(("all models", UNGUIDED)), sums.get(("all models", GUIDED))
    if a and b:
        change.rows.append([_rel(float(getattr(b, f)), float(getattr(a, f))) for f in
                            ("input_tokens", "output_tokens", "cache_read", "cache_write", "cost_usd")])
    return t, change


def run_table(sheet: ScoreSheet) -> Table:
    """Every scored run: final candidate, its turn and task speedup, first correct turn."""
    t = Table(key="runs", title="Runs", columns=[
        Column(name="model"), Column(name="guidance"), Column(name="task"), Column(name="final candidate"),
        Column(name="final turn"), Column(name="first correct turn"), Column(name="speedup", fmt=SCORE),
        Column(name="run")])
    for r in sheet.runs:
        t.rows.append([r.model, r.guidance, r.task, r.final_candidate, r.final_turn, r.first_correct_turn,
                       r.speedup, r.run_id])
    return t


def group_table(sheet: ScoreSheet) -> Table:
    """Per (model, guidance): tasks, correct, S_perf, fast_p; then overall S_perf per guidance."""
    t = Table(key="scores", title="Scores per model and guidance", columns=[
        Column(name="model"), Column(name="guidance"), Column(name="tasks", fmt="d"), Column(name="correct", fmt="d"),
        Column(name="S_perf", fmt=SCORE)] + [Column(name=f"fast_{p:g}", fmt=PCT) for p in FAST_P_THRESHOLDS])
    for lv in levels_present(sheet):
        for m in sheet.models():
            if g := sheet.group(m, lv):
                t.rows.append([m, lv, g.n_tasks, g.n_correct, g.s_perf] + [g.fast_p[p] for p in FAST_P_THRESHOLDS])
        t.rows.append(["all models (geomean)", lv, None, None, sheet.overall(lv)]
                      + [None] * len(FAST_P_THRESHOLDS))
    return t


def runs_by_task(sheet: ScoreSheet) -> dict[str, list[RunScore]]:
    """task -> its scored runs."""
    out: dict[str, list[RunScore]] = defaultdict(list)
    for r in sheet.runs:
        out[r.task].append(r)
    return out
