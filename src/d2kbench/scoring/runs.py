"""Scores of a set of agent runs: per run, per (model, guidance), and across models.

docs/protocol.md ("Scores", "Scores under missing data"): a run's final answer is chosen by
:func:`d2kbench.scoring.selection.final_candidate`; its task speedup is the geometric mean
over workloads against the baseline; S_perf per model is the geometric mean over tasks with
0.5 for a failed task; fast_p counts all tasks; overall S_perf is the geometric mean over
models.

The tasks of a score are *declared* (:class:`TaskSet`: the suite, the ``--task`` selection,
or a campaign's plan), never inferred from the runs that happen to be present. A declared
task without a scored run (no run, a run still running or interrupted, a run on other
hardware, a task without a baseline) counts as failed, and :attr:`GroupScore.missing` says
why, so every table can say how many tasks it counted as failed for lack of a result.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Literal

from pydantic import BaseModel

from d2kbench.scoring.baseline import Baseline
from d2kbench.scoring.metrics import (
    FAST_P_THRESHOLDS,
    MissingBaselineError,
    ScoringError,
    fast_p,
    overall_performance_score,
    performance_score,
)
from d2kbench.scoring.records import DESIGN, RunRecord, guidance_rank
from d2kbench.scoring.selection import eligible_speedups, final_candidate
from d2kbench.scoring.speedup import geomean

#: Why a declared task has no scored run (the values of :attr:`GroupScore.missing`).
NO_RUN = "no run"
NO_BASELINE = "no baseline"


class RunScore(BaseModel):
    """The score of one run.

    ``speedup``: the final candidate's task speedup (None: no eligible candidate, the task
    failed). ``eligible``: (turn, task speedup) of every eligible candidate in turn order, the
    input of the trajectory score. ``incomplete``: candidates left out because their
    evaluation is not complete (see :class:`d2kbench.scoring.records.RunRecord`).
    """

    run_id: str
    task: str
    model: str
    guidance: str
    campaign: str | None = None
    backend: str = ""
    seed: int = 0
    budget_turns: int = 0
    final_candidate: int | None = None
    final_sha256: str = ""
    final_turn: int | None = None
    speedup: float | None = None
    first_correct_turn: int | None = None
    eligible: list[tuple[int, float]] = []
    incomplete: list[str] = []

    @property
    def correct(self) -> bool:
        """The run has an eligible final candidate."""
        return self.speedup is not None


class GroupScore(BaseModel):
    """Scores of one (model, guidance) over its declared tasks.

    ``tasks``: the declared tasks, every one counted. ``missing``: task -> why it has no
    scored run (it counts as failed: 0.5 in S_perf, never fast). ``fast_p``: threshold ->
    fraction of the declared tasks. ``geomean_speedup``: geometric mean of the task speedups,
    only when every declared task is correct (no 0.5 penalty involved), else None.
    """

    model: str
    guidance: str
    tasks: list[str]
    n_correct: int
    s_perf: float
    fast_p: dict[float, float]
    geomean_speedup: float | None = None
    missing: dict[str, str] = {}
    task_source: str = ""

    @property
    def n_tasks(self) -> int:
        """The number of declared tasks (the denominator of every score of the group)."""
        return len(self.tasks)

    def missing_counts(self) -> dict[str, int]:
        """Reason -> number of tasks counted as failed for it, reasons sorted."""
        out: dict[str, int] = defaultdict(int)
        for why in self.missing.values():
            out[why] += 1
        return dict(sorted(out.items()))


class DeclaredGroup(BaseModel):
    """The tasks one plan declares for one (model, guidance)."""

    model: str
    guidance: str
    tasks: list[str]
    source: str


class TaskSet(BaseModel):
    """The declared tasks of every score (docs/protocol.md, "Scores under missing data").

    ``groups``: (model, guidance) cells declared by campaign plans, with their tasks (several
    entries for one cell are united); any other (model, guidance) is scored over ``default``,
    which comes from ``source`` (the suite, or the ``--task`` selection).
    """

    default: list[str]
    source: str
    groups: list[DeclaredGroup] = []

    def tasks_of(self, model: str, guidance: str) -> tuple[list[str], str]:
        """(sorted declared tasks, where they come from) of one (model, guidance)."""
        mine = [g for g in self.groups if g.model == model and g.guidance == guidance]
        if not mine:
            return sorted(self.default), self.source
        return sorted({t for g in mine for t in g.tasks}), " + ".join(sorted({g.source for g in mine}))

    def all_tasks(self) -> list[str]:
        """Every task declared anywhere, sorted."""
        return sorted({*self.default, *(t for g in self.groups for t in g.tasks)})


class LeftOut(BaseModel):
    """A run that exists but is not scored, and why (``running``, ``interrupted``, evaluated
    on another machine, a superseded attempt); names the reason of a missing task."""

    run_id: str
    task: str
    model: str
    guidance: str
    reason: str
    superseded: bool = False


class ScoreSheet(BaseModel):
    """Everything scored from one selection of runs against one baseline.

    ``no_baseline``: task -> reason, for tasks whose runs were not scored because the baseline
    has no latencies for them (only with ``missing="fail"``: they count as failed).
    ``outside``: run_id -> why, for runs of a task their (model, guidance) does not declare.
    """

    baseline: Baseline
    runs: list[RunScore]
    groups: list[GroupScore]
    no_baseline: dict[str, str] = {}
    outside: dict[str, str] = {}

    def group(self, model: str, guidance: str) -> GroupScore | None:
        """The scores of one (model, guidance), None when the selection has no such group."""
        for g in self.groups:
            if g.model == model and g.guidance == guidance:
                return g
        return None

    def models(self) -> list[str]:
        """The scored models, sorted."""
        return sorted({g.model for g in self.groups})

    def overall(self, guidance: str) -> float | None:
        """Overall S_perf of one guidance setting: geometric mean over the models that have it."""
        scores = {g.model: g.s_perf for g in self.groups if g.guidance == guidance}
        return overall_performance_score(scores) if scores else None

    def missing_note(self, guidance: Iterable[str] | None = None) -> str | None:
        """The note of every table that scores these groups: per (model, guidance), how many
        declared tasks counted as failed for lack of a scored result and why; then the scored
        runs that left out candidates whose evaluation is not complete. None when neither
        happened (in the groups of ``guidance``, default all)."""
        levels = None if guidance is None else set(guidance)
        parts = []
        for g in self.groups:
            if g.missing and (levels is None or g.guidance in levels):
                why = ", ".join(f"{n} {reason}" for reason, n in g.missing_counts().items())
                parts.append(f"{g.model} / {g.guidance}: {len(g.missing)} of {g.n_tasks} ({why})")
        sentences = []
        if parts:
            sentences.append("counted as failed for lack of a scored result (0.5 in S_perf, 0.1 in S'_perf, never "
                             "fast): " + "; ".join(parts) + ".")
        partial = self.partial_note(guidance)
        if partial:
            sentences.append(partial)
        return " ".join(sentences) or None

    def partial_note(self, guidance: Iterable[str] | None = None) -> str | None:
        """One sentence naming the scored runs (of ``guidance``, default all) that left out
        candidates because their evaluation is not complete, with how many; None without any."""
        levels = None if guidance is None else set(guidance)
        partial = [f"{r.model} / {r.guidance} / {r.task}: {len(r.incomplete)}" for r in self.runs
                   if r.incomplete and (levels is None or r.guidance in levels)]
        if not partial:
            return None
        return ("scored from complete evaluations only; candidates left out because their evaluation is running "
                "or interrupted: " + "; ".join(partial) + ".")

    def missing_summary(self, guidance: Iterable[str] | None = None) -> str | None:
        """A short form of :meth:`missing_note` for a figure's footnote: the number of tasks
        counted as failed per reason, over the groups of ``guidance`` (default all); None when
        there are none."""
        levels = None if guidance is None else set(guidance)
        counts: dict[str, int] = defaultdict(int)
        groups = 0
        for g in self.groups:
            if g.missing and (levels is None or g.guidance in levels):
                groups += 1
                for why, n in g.missing_counts().items():
                    counts[why] += n
        partial = sum(1 for r in self.runs if r.incomplete and (levels is None or r.guidance in levels))
        out = []
        if counts:
            out.append(f"{sum(counts.values())} declared task(s) in {groups} (model, guidance) group(s) counted as "
                       "failed for lack of a scored result (" + ", ".join(f"{n} {w}" for w, n in sorted(counts.items()))
                       + ")")
        if partial:
            out.append(f"{partial} run(s) scored without candidates whose evaluation is not complete")
        return "; ".join(out) + "; see the report's notes." if out else None


def score_run(run: RunRecord, baseline_ms: dict[str, float]) -> RunScore:
    """Score one run against its task's baseline latencies (workload -> ms).

    Raises:
        ScoringError: an eligible candidate whose workloads do not match the baseline's, or a
            bad latency (see :func:`d2kbench.scoring.metrics.task_speedup`).
    """
    scored = eligible_speedups(run.candidates, baseline_ms, run.task)
    final = final_candidate(run.candidates, run.task)
    speed = next((s for c, s in scored if final is not None and c.id == final.id), None)
    return RunScore(
        run_id=run.run_id, task=run.task, model=run.model, guidance=run.guidance, campaign=run.campaign,
        backend=run.backend, seed=run.seed, budget_turns=run.budget_turns,
        final_candidate=final.id if final else None, final_sha256=final.sha256 if final else "",
        final_turn=final.turn if final else None, speedup=speed,
        first_correct_turn=scored[0][0].turn if scored else None,
        eligible=[(c.turn, s) for c, s in scored], incomplete=list(run.incomplete),
    )


def group_score(model: str, guidance: str, runs: list[RunScore], tasks: Iterable[str],
                missing: Mapping[str, str] | None = None, thresholds: Iterable[float] = FAST_P_THRESHOLDS,
                task_source: str = "") -> GroupScore:
    """S_perf, fast_p and correctness of one (model, guidance) over its declared ``tasks``.

    Args:
        runs: the scored runs of the group, at most one per task, each of a declared task.
        tasks: the declared tasks; one without a run counts as failed.
        missing: task -> why it has no run (default :data:`NO_RUN`).

    Raises:
        ScoringError: no declared tasks, two runs of one task (the score would silently pick
            one), or a run of a task that is not declared.
    """
    declared = sorted(set(tasks))
    if not declared:
        raise ScoringError(f"model {model!r}, guidance {guidance!r}: no declared tasks")
    by_task: dict[str, RunScore] = {}
    for r in runs:
        if r.task in by_task:
            raise ScoringError(f"model {model!r}, guidance {guidance!r}: task {r.task!r} has more than one run "
                               f"({by_task[r.task].run_id}, {r.run_id}); select one campaign or seed")
        if r.task not in declared:
            raise ScoringError(f"model {model!r}, guidance {guidance!r}: run {r.run_id} is of task {r.task!r}, "
                               f"which is not declared ({', '.join(declared)})")
        by_task[r.task] = r
    speedups = {t: by_task[t].speedup if t in by_task else None for t in declared}
    absent = {t: (missing or {}).get(t, NO_RUN) for t in declared if t not in by_task}
    correct = [s for s in speedups.values() if s is not None]
    return GroupScore(
        model=model, guidance=guidance, tasks=declared, n_correct=len(correct),
        s_perf=performance_score(speedups), fast_p={p: fast_p(speedups, p) for p in thresholds},
        geomean_speedup=geomean(correct) if len(correct) == len(speedups) else None,
        missing=absent, task_source=task_source,
    )


def _reason(left: list[LeftOut]) -> str:
    """Why a cell has no scored run, from the runs left out of it (the newest reason first)."""
    live = [x.reason for x in left if not x.superseded]
    return live[-1] if live else NO_RUN


def score_runs(runs: Iterable[RunRecord], baseline: Baseline, tasks: TaskSet,
               missing: Literal["error", "fail"] = "error", left_out: Iterable[LeftOut] = ()) -> ScoreSheet:
    """Score every run and every (model, guidance) group over its declared tasks.

    Args:
        runs: the selected runs; independent-design runs (guidance ``design``) have no code and
            are left out (they are judged, not timed).
        baseline: resolved for (at least) the runs' tasks.
        tasks: the declared task set; the groups are those of the runs, of ``left_out`` and of
            the cells that ``tasks`` declares.
        missing: a task with runs but without baseline latencies raises (``error``) or counts
            as failed in every score and is listed in :attr:`ScoreSheet.no_baseline` (``fail``).
        left_out: runs that exist but are not scored; they name why a task is missing.

    Raises:
        MissingBaselineError: with ``missing="error"``, naming every task without a baseline.
        ScoringError: as :func:`score_run` and :func:`group_score`; an unknown ``missing``.
    """
    if missing not in ("error", "fail"):
        raise ScoringError(f"missing must be 'error' or 'fail', got {missing!r}")
    runs = [r for r in runs if r.guidance != DESIGN]
    left_out = [x for x in left_out if x.guidance != DESIGN]
    keys = {(r.model, r.guidance) for r in runs} | {(x.model, x.guidance) for x in left_out}
    keys |= {(g.model, g.guidance) for g in tasks.groups if g.guidance != DESIGN}
    declared = {k: tasks.tasks_of(*k) for k in keys}
    outside = {r.run_id: f"task {r.task!r} is not declared for {r.model} / {r.guidance} "
                         f"({declared[(r.model, r.guidance)][1]})"
               for r in runs if r.task not in declared[(r.model, r.guidance)][0]}
    runs = [r for r in runs if r.run_id not in outside]
    lacking = {}
    for r in runs:
        if r.task not in baseline.latencies_ms:
            lacking[r.task] = baseline.missing.get(r.task, "the baseline was not resolved for this task")
    if lacking and missing == "error":
        raise MissingBaselineError(dict(sorted(lacking.items())))
    scores = [score_run(r, baseline.latencies_ms[r.task]) for r in runs if r.task not in lacking]
    by_group: dict[tuple[str, str], list[RunScore]] = defaultdict(list)
    for s in scores:
        by_group[(s.model, s.guidance)].append(s)
    cells: dict[tuple[str, str, str], list[LeftOut]] = defaultdict(list)
    for x in left_out:
        cells[(x.model, x.guidance, x.task)].append(x)
    groups = []
    for m, g in sorted(keys, key=lambda k: (k[0], guidance_rank(k[1]))):
        task_list, source = declared[(m, g)]
        why = {t: NO_BASELINE if t in lacking and any(r.task == t and (r.model, r.guidance) == (m, g) for r in runs)
               else _reason(cells.get((m, g, t), [])) for t in task_list}
        groups.append(group_score(m, g, by_group.get((m, g), []), task_list, why, task_source=source))
    return ScoreSheet(
        baseline=baseline, groups=groups, no_baseline=dict(sorted(lacking.items())), outside=outside,
        runs=sorted(scores, key=lambda s: (s.model, guidance_rank(s.guidance), s.task, s.run_id)),
    )
