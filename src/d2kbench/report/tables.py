"""The paper's tables, built from a :class:`ScoreSheet` and the store's data (docs/protocol.md).

Each builder returns a :class:`Table` of raw values. Columns named ``none`` and ``L1+L2+L3``
are the unguided and the fully guided settings of the paired runs. Every score is over the
declared tasks; a table whose figures include tasks counted as failed for lack of a result
says how many and why in a note.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from d2kbench.report.data import ReportData, Usage, Verdict
from d2kbench.report.document import Column, Table
from d2kbench.scoring.baseline import SOLUTION_BASELINES
from d2kbench.scoring.metrics import FAST_P_THRESHOLDS, ScoringError, performance_score, task_speedup
from d2kbench.scoring.records import DESIGN, GUIDED, UNGUIDED, RunRecord, guidance_rank
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
    note = sheet.missing_note((UNGUIDED, GUIDED))
    if note:
        t.notes.append(note)
    t.notes.append("tasks: the declared tasks (docs/protocol.md); correct: share of them whose final submission "
                   "passed every check; S_perf: geometric mean over the declared tasks of the task speedup, 0.5 for "
                   "a failed or missing task; all models: model-task pairs pooled, S_perf as the geometric mean "
                   "over models.")
    return t


def solutions_table(sheet: ScoreSheet, data: ReportData) -> Table:
    """Table 1b: S_perf of the task solutions against the same baseline, over the declared
    tasks. A task counts as failed for a solution with a failed workload, without complete
    timings on this machine, or without a baseline (nothing to compare against); a note says
    how many tasks counted as failed for each of the last two reasons. A solution timed on no
    declared task has no row."""
    t = Table(key="table1b_task_solutions", title="Table 1b: the task solutions against the same baseline",
              columns=[Column(name="solution"), Column(name="tasks", fmt="d"), Column(name="correct", fmt=PCT),
                       Column(name="S_perf", fmt=SCORE)])
    base = sheet.baseline.latencies_ms
    unbaselined = [task for task in data.tasks if task not in base]
    untimed: dict[str, list[str]] = {}
    for sol in SOLUTION_BASELINES:
        speedups: dict[str, float | None] = {}
        timed = 0
        for task in data.tasks:
            timings = data.solutions.get(task, {}).get(sol)
            if timings:
                timed += 1
            if task not in base:
                speedups[task] = None  # no baseline: counted as failed, named in a note
                continue
            if not timings:
                speedups[task] = None
                untimed.setdefault(sol, []).append(task)
                continue
            if any(v.mean_ms is None for v in timings.values()):
                speedups[task] = None
                continue
            try:
                means = {w: v.mean_ms for w, v in timings.items() if v.mean_ms is not None}  # all, checked above
                speedups[task] = task_speedup(base[task], means, task)
            except ScoringError as e:
                speedups[task] = None
                t.notes.append(f"{sol} counted as failed on {task}: {e}")
        if timed:
            ok = sum(s is not None for s in speedups.values())
            t.rows.append([sol, len(speedups), ok / len(speedups), performance_score(speedups)])
    for sol, missing in untimed.items():
        if any(r[0] == sol for r in t.rows):
            t.notes.append(f"{sol}: {len(missing)} task(s) counted as failed for lack of complete timings on this "
                           f"machine: {', '.join(missing)}.")
    if unbaselined and t.rows:
        why = "; ".join(f"{task} ({sheet.baseline.missing.get(task, 'no baseline latencies')})" for task in unbaselined)
        t.notes.append(f"{len(unbaselined)} declared task(s) counted as failed in every row for lack of a baseline: "
                       f"{why}.")
    return t


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _impl_js(verdicts: list[Verdict], run: RunScore) -> float | None:
    """Median JS of one judge's implementation verdicts of a run's final candidate: those whose
    target is its source hash, or (older verdicts) the run id with the same recorded source."""
    js = [v.js for v in verdicts if v.kind == "impl" and v.status == "judged" and run.final_sha256
          and (v.target == run.final_sha256 or (v.target == run.run_id and v.candidate_sha256 == run.final_sha256))]
    return _median(js)


def table2(sheet: ScoreSheet, data: ReportData) -> Table:
    """Table 2: judge scores beside S_perf, per judge and model (docs/protocol.md, "Judge").

    Verdicts are grouped by judge configuration, (judge model, prompt version, rubric
    version), and never pooled across configurations. Within one configuration, JS_impl of a
    run is the median ``js`` of the verdicts of its final candidate (the scoring rule's, by
    source hash), and 0 for a run without a correct submission or a declared task without a
    scored run (incorrect submissions score 0). JS_design: the median ``design`` verdict of
    each independent-design run (target = run id). Per model, the arithmetic mean over its
    tasks; ``judged`` counts the tasks with a value and the declared tasks per column.
    """
    t = Table(key="table2_judge", title="Table 2: judge scores (0-100) beside S_perf",
              columns=[Column(name="judge (model; prompt; rubric)"), Column(name="model"),
                       Column(name="JS_design", fmt=".1f"),
                       Column(name="JS_impl none", fmt=".1f"), Column(name="JS_impl L1+L2+L3", fmt=".1f"),
                       Column(name="S_perf none", fmt=SCORE), Column(name="S_perf L1+L2+L3", fmt=SCORE),
                       Column(name="judged (design / none / guided)")])
    runs = [r for r in sheet.runs if r.guidance in (UNGUIDED, GUIDED)]
    designs = [r for r in data.runs if r.guidance == DESIGN]
    finals = {r.final_sha256 for r in runs if r.final_sha256}
    run_ids = {r.run_id for r in runs} | {r.run_id for r in designs}
    counted = [v for v in data.verdicts if v.target in finals or v.target in run_ids]
    judges = sorted({v.judge for v in counted})
    mean = lambda xs: statistics.fmean(xs) if xs else None  # noqa: E731
    for judge in judges:
        mine = [v for v in counted if v.judge == judge]
        label = "; ".join(judge)
        for m in sheet.models():
            targets = {x for r in runs if r.model == m for x in (r.run_id, r.final_sha256) if x}
            targets |= {r.run_id for r in designs if r.model == m}
            if not any(v.target in targets for v in mine):
                continue
            vals: dict[str, list[float]] = defaultdict(list)
            totals: dict[str, int] = defaultdict(int)
            for lv in (UNGUIDED, GUIDED):
                g = sheet.group(m, lv)
                if g is None:
                    continue
                totals[lv] = g.n_tasks
                vals[lv] += [0.0] * len(g.missing)
                for r in runs:
                    if (r.model, r.guidance) == (m, lv):
                        js = 0.0 if not r.correct else _impl_js(mine, r)
                        if js is not None:
                            vals[lv].append(js)
            for d in designs:
                if d.model == m:
                    totals[DESIGN] += 1
                    js = _median([v.js for v in mine if v.kind == "design" and v.target == d.run_id])
                    if js is not None:
                        vals[DESIGN].append(js)
            u, g = sheet.group(m, UNGUIDED), sheet.group(m, GUIDED)
            judged = " / ".join(f"{len(vals[k])}/{totals[k]}" for k in (DESIGN, UNGUIDED, GUIDED))
            t.rows.append([label, m, mean(vals[DESIGN]), mean(vals[UNGUIDED]), mean(vals[GUIDED]),
                           u.s_perf if u else None, g.s_perf if g else None, judged])
    if len(judges) > 1:
        t.notes.append(f"{len(judges)} judge configurations: each row is one judge model, prompt version and rubric "
                       "version; their verdicts are never pooled.")
    note = sheet.missing_note((UNGUIDED, GUIDED))
    if note:
        t.notes.append("JS_impl counts 0 for a task without a scored run: " + note)
    by_run = {r.run_id: r for r in runs}
    other = [v for v in data.verdicts if v.kind == "impl" and v.target in by_run and v.status == "judged"
             and v.candidate_sha256 != by_run[v.target].final_sha256]
    if other:
        t.notes.append(f"{len(other)} verdict(s) of a run judged another candidate than the final-selection rule's "
                       "and are not counted.")
    stray = [v for v in data.verdicts if v.target not in finals and v.target not in run_ids]
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
    note = sheet.missing_note()
    if note:
        t.notes.append(note)
    return t


def table4(sheet: ScoreSheet) -> Table:
    """Table 4: geometric-mean speedup over the declared tasks for the models whose final
    submissions are correct on every declared task both unguided and guided (no 0.5 penalty
    enters; a missing task makes a model not fully correct); the last row is the geometric
    mean over those models."""
    t = Table(key="table4_fully_correct", title="Table 4: geometric-mean speedup of fully-correct models",
              columns=[Column(name="model"), Column(name="tasks", fmt="d"), Column(name="none", fmt=SCORE),
                       Column(name="L1+L2+L3", fmt=SCORE), Column(name="change", fmt=REL)])
    rows: list[tuple[str, int, float, float, float | None]] = []
    unfinished = []
    for m in sheet.models():
        u, g = sheet.group(m, UNGUIDED), sheet.group(m, GUIDED)
        if u and g and u.geomean_speedup is not None and g.geomean_speedup is not None:
            gu, gg = u.geomean_speedup, g.geomean_speedup
            rows.append((m, u.n_tasks, gu, gg, _rel(gg, gu)))
        elif u and g and (u.missing or g.missing):
            unfinished.append(f"{m} (unguided: {_reasons(u)}; guided: {_reasons(g)})")
    t.rows += [list(r) for r in rows]
    if rows:
        gu, gg = geomean(r[2] for r in rows), geomean(r[3] for r in rows)
        t.rows.append([f"{len(rows)} fully-correct model(s)", None, gu, gg, _rel(gg, gu)])
    else:
        t.notes.append("no model is correct on every task in both settings.")
    if unfinished:
        t.notes.append("not fully correct because declared tasks have no scored result (counted as failed): "
                       + ", ".join(unfinished) + ".")
    partial = sheet.partial_note((UNGUIDED, GUIDED))
    if partial:
        t.notes.append(partial)
    return t


def _reasons(g) -> str:
    """``2 no run, 1 running`` for a group's missing tasks, ``0`` when it has none."""
    return ", ".join(f"{n} {why}" for why, n in g.missing_counts().items()) or "0"


def table5(sheet: ScoreSheet) -> Table:
    """Table 5: fast_p per model and guidance (share of all tasks with task speedup > p)."""
    t = Table(key="table5_fast_p", title="Table 5: fast_p (share of all tasks, failed ones included, faster than p)",
              columns=[Column(name="model"), Column(name="guidance"), Column(name="tasks", fmt="d")]
              + [Column(name=f"fast_{p:g}", fmt=PCT) for p in FAST_P_THRESHOLDS])
    for m in sheet.models():
        for lv in levels_present(sheet):
            if g := sheet.group(m, lv):
                t.rows.append([m, lv, g.n_tasks, *(g.fast_p[p] for p in FAST_P_THRESHOLDS)])
    note = sheet.missing_note()
    if note:
        t.notes.append(note)
    return t


def trajectory_tables(series: dict[tuple[str, str], Trajectory], overall: dict[str, Trajectory],
                      sheet: ScoreSheet | None = None) -> list[Table]:
    """Figure 4 data: S'_perf at a quarter, half, three quarters and the end of the turn grid per
    (model, guidance) and across models; and every turn in long form (CSV only). With
    ``sheet``, a note names the declared tasks counted 0.1 throughout for lack of a run."""
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
    note = sheet.missing_note() if sheet is not None else None
    if note:
        t.notes.append(note)
    return [t, full]


def _usage_row(label: str, guidance: str, u: Usage) -> list:
    cost = "unknown" if u.cost_usd is None else u.cost_usd
    return [label, guidance, u.runs, u.input_tokens, u.output_tokens, u.cache_read, u.cache_write, cost]


_USAGE_FIELDS = ("input_tokens", "output_tokens", "cache_read", "cache_write")


def table6(data: ReportData) -> tuple[Table, Table]:
    """Table 6: token usage and estimated API cost per model and guidance (summed over runs),
    totals per guidance; and Table 6b, the relative change from unguided to guided over
    *paired* runs only: a (model, backend, task, seed) with a scored run in both settings.

    A cost that includes a model without a price is unknown (shown as ``unknown``, with a
    note naming the models), never US$0; the cost change of Table 6b is taken over the pairs
    whose runs are all priced, and says how many those are.
    """
    cols = [Column(name="model"), Column(name="guidance"), Column(name="runs", fmt="d"), Column(name="input", fmt=","),
            Column(name="output", fmt=","), Column(name="cache read", fmt=","), Column(name="cache write", fmt=","),
            Column(name="cost USD", fmt=",.2f")]
    t = Table(key="table6_tokens", title="Table 6: tokens and estimated API cost", columns=cols)
    runs = data.runs
    sums: dict[tuple[str, str], Usage] = {}
    for run in runs:
        u = data.usage.get(run.run_id, Usage(runs=1))
        for key in ((run.model, run.guidance), ("all models", run.guidance)):
            sums.setdefault(key, Usage()).add(u)
    for (m, lv) in sorted(sums, key=lambda k: (k[0] == "all models", k[0], guidance_rank(k[1]))):
        t.rows.append(_usage_row(m, lv, sums[(m, lv)]))
    unpriced = sorted({m for u in sums.values() for m in u.unpriced_models})
    if unpriced:
        t.notes.append(f"cost unknown: no price for {', '.join(unpriced)} in the price table; sums that include "
                       "their turns show 'unknown' (never US$0).")
    left = data.skipped_usage
    if left.turns:
        cost = "unknown cost" if left.cost_usd is None else f"US${left.cost_usd:,.2f}"
        t.notes.append(f"not in the table: {left.turns} turns of left-out runs (still running, interrupted, "
                       f"superseded attempts or other hardware): {left.input_tokens:,} input, {left.output_tokens:,} "
                       f"output, {left.cache_read:,} cache-read, {left.cache_write:,} cache-write tokens, {cost}.")
    change = Table(key="table6b_token_change", title="Table 6b: change from unguided to guided over paired runs",
                   columns=[Column(name="pairs", fmt="d")]
                   + [Column(name=c, fmt=REL) for c in ("input", "output", "cache read", "cache write", "cost")]
                   + [Column(name="priced pairs", fmt="d")])
    by_cell: dict[tuple, dict[str, RunRecord]] = defaultdict(dict)
    for run in runs:
        if run.guidance in (UNGUIDED, GUIDED):
            by_cell[(run.model, run.backend, run.task, run.seed)][run.guidance] = run
    pairs = [(c[UNGUIDED], c[GUIDED]) for c in by_cell.values() if UNGUIDED in c and GUIDED in c]
    unpaired = sum(1 for c in by_cell.values() if len(c) == 1)
    a, b = Usage(), Usage()
    ca, cb, priced = 0.0, 0.0, 0
    for ru, rg in pairs:
        uu, ug = data.usage.get(ru.run_id, Usage(runs=1)), data.usage.get(rg.run_id, Usage(runs=1))
        a.add(uu)
        b.add(ug)
        if uu.cost_usd is not None and ug.cost_usd is not None:
            ca, cb, priced = ca + uu.cost_usd, cb + ug.cost_usd, priced + 1
    if pairs:
        change.rows.append([len(pairs), *(_rel(float(getattr(b, f)), float(getattr(a, f))) for f in _USAGE_FIELDS),
                            _rel(cb, ca) if priced else None, priced])
    change.notes.append(f"relative change of the summed tokens and cost of {len(pairs)} paired (model, task) run(s) "
                        "with a scored run both unguided and guided (same backend and seed)"
                        + (f"; {unpaired} run(s) without a partner are left out" if unpaired else "") + ".")
    if pairs and priced < len(pairs):
        change.notes.append(f"cost: over the {priced} pair(s) whose runs are all priced; {len(pairs) - priced} "
                            "pair(s) include a model without a price.")
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
    """Per (model, guidance): declared tasks, correct, those counted as failed for lack of a
    scored result, S_perf, fast_p; then overall S_perf per guidance."""
    t = Table(key="scores", title="Scores per model and guidance", columns=[
        Column(name="model"), Column(name="guidance"), Column(name="tasks", fmt="d"), Column(name="correct", fmt="d"),
        Column(name="no result", fmt="d"), Column(name="S_perf", fmt=SCORE)]
        + [Column(name=f"fast_{p:g}", fmt=PCT) for p in FAST_P_THRESHOLDS])
    for lv in levels_present(sheet):
        for m in sheet.models():
            if g := sheet.group(m, lv):
                t.rows.append([m, lv, g.n_tasks, g.n_correct, len(g.missing), g.s_perf,
                               *(g.fast_p[p] for p in FAST_P_THRESHOLDS)])
        t.rows.append(["all models (geomean)", lv, None, None, None, sheet.overall(lv)]
                      + [None] * len(FAST_P_THRESHOLDS))
    note = sheet.missing_note()
    if note:
        t.notes.append(note)
    return t


def runs_by_task(sheet: ScoreSheet) -> dict[str, list[RunScore]]:
    """task -> its scored runs."""
    out: dict[str, list[RunScore]] = defaultdict(list)
    for r in sheet.runs:
        out[r.task].append(r)
    return out
