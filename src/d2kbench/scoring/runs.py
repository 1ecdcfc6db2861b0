"""Scores of a set of agent runs: per run, per (model, guidance), and across models.

SPEC.md section 3: a run's final answer is its best eligible candidate; its task speedup is the
geometric mean over workloads against the baseline; S_perf per model is the geometric mean over
tasks with 0.5 for a failed task; fast_p counts all tasks; overall S_perf is the geometric mean
over models.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel

from d2kbench.scoring.baseline import Baseline
from d2kbench.scoring.metrics import (
    FAST_P_THRESHOLDS, MissingBaselineError, ScoringError, fast_p, overall_performance_score, performance_score,
)
from d2kbench.scoring.records import DESIGN, RunRecord, guidance_rank
from d2kbench.scoring.selection import best_of, eligible_speedups
from d2kbench.scoring.speedup import geomean


class RunScore(BaseModel):
    """The score of one run.

    ``speedup``: the final candidate's task speedup (None: no eligible candidate, the task
    failed). ``eligible``: (turn, task speedup) of every eligible candidate in turn order, the
    input of the trajectory score.
    """

    run_id: str
    task: str
    model: str
    guidance: str
    campaign: str | None = None
    seed: int = 0
    budget_turns: int = 0
    final_candidate: int | None = None
    final_sha256: str = ""
    final_turn: int | None = None
    speedup: float | None = None
    first_correct_turn: int | None = None
    eligible: list[tuple[int, float]] = []

    @property
    def correct(self) -> bool:
        """The run has an eligible final candidate."""
        return self.speedup is not None


class GroupScore(BaseModel):
    """Scores of one (model, guidance) over its tasks.

    ``fast_p``: threshold -> fraction of tasks. ``geomean_speedup``: geometric mean of the task
    speedups, only when every task is correct (no 0.5 penalty involved), else None.
    """

    model: str
    guidance: str
    tasks: list[str]
    n_correct: int
    s_perf: float
    fast_p: dict[float, float]
    geomean_speedup: float | None = None

    @property
    def n_tasks(self) -> int:
        """The number of tasks the group has a run for."""
        return len(self.tasks)


class ScoreSheet(BaseModel):
    """Everything scored from one selection of runs against one baseline.

    ``excluded``: task -> reason, for tasks left out of every score because the baseline has no
    latencies for them (only with ``missing="exclude"``).
    """

    baseline: Baseline
    runs: list[RunScore]
    groups: list[GroupScore]
    excluded: dict[str, str] = {}

    def group(self, model: str, guidance: str) -> GroupScore | None:
        """The scores of one (model, guidance), None when the selection has no such runs."""
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


def score_run(run: RunRecord, baseline_ms: dict[str, float]) -> RunScore:
    """Score one run against its task's baseline latencies (workload -> ms).

    Raises:
        ScoringError: an eligible candidate whose workloads do not match the baseline's, or a
            bad latency (see :func:`d2kbench.scoring.metrics.task_speedup`).
    """
    scored = eligible_speedups(run.candidates, baseline_ms, run.task)
    final = best_of(scored)
    return RunScore(
        run_id=run.run_id, task=run.task, model=run.model, guidance=run.guidance, campaign=run.campaign,
        seed=run.seed, budget_turns=run.budget_turns,
        final_candidate=final[0].id if final else None, final_sha256=final[0].sha256 if final else "",
        final_turn=final[0].turn if final else None,
        speedup=final[1] if final else None,
        first_correct_turn=scored[0][0].turn if scored else None,
        eligible=[(c.turn, s) for c, s in scored],
    )


def group_score(model: str, guidance: str, runs: list[RunScore],
                thresholds: Iterable[float] = FAST_P_THRESHOLDS) -> GroupScore:
    """S_perf, fast_p and correctness of one (model, guidance) from its run scores.

    Raises:
        ScoringError: no runs, or two runs of the same task (the score would silently pick one).
    """
    by_task: dict[str, RunScore] = {}
    for r in runs:
        if r.task in by_task:
            raise ScoringError(f"model {model!r}, guidance {guidance!r}: task {r.task!r} has more than one run "
                               f"({by_task[r.task].run_id}, {r.run_id}); select one campaign or seed")
        by_task[r.task] = r
    if not by_task:
        raise ScoringError(f"model {model!r}, guidance {guidance!r}: no runs")
    speedups = {t: by_task[t].speedup for t in sorted(by_task)}
    correct = [s for s in speedups.values() if s is not None]
    return GroupScore(
        model=model, guidance=guidance, tasks=list(speedups), n_correct=len(correct),
        s_perf=performance_score(speedups), fast_p={p: fast_p(speedups, p) for p in thresholds},
        geomean_speedup=geomean(correct) if len(correct) == len(speedups) else None,
    )


def score_runs(runs: Iterable[RunRecord], baseline: Baseline,
               missing: Literal["error", "exclude"] = "error") -> ScoreSheet:
    """Score every run and every (model, guidance) group.

    Args:
        runs: the selected runs; independent-design runs (guidance ``design``) have no code and
            are left out (they are judged, not timed).
        baseline: resolved for (at least) the runs' tasks.
        missing: a task without baseline latencies raises (``error``) or is left out of every
            score and listed in :attr:`ScoreSheet.excluded` (``exclude``).

    Raises:
        MissingBaselineError: with ``missing="error"``, naming every task without a baseline.
        ScoringError: as :func:`score_run` and :func:`group_score`; an unknown ``missing``.
    """
    if missing not in ("error", "exclude"):
        raise ScoringError(f"missing must be 'error' or 'exclude', got {missing!r}")
    runs = [r for r in runs if r.guidance != DESIGN]
    lacking = {}
    for r in runs:
        if r.task not in baseline.latencies_ms:
            lacking[r.task] = baseline.missing.get(r.task, "the baseline was not resolved for this task")
    if lacking and missing == "error":
        raise MissingBaselineError(dict(sorted(lacking.items())))
    scores = [score_run(r, baseline.latencies_ms[r.task]) for r in runs if r.task not in lacking]
    groups: dict[tuple[str, str], list[RunScore]] = defaultdict(list)
    for s in scores:
        groups[(s.model, s.guidance)].append(s)
    return ScoreSheet(
        baseline=baseline, runs=sorted(scores, key=lambda s: (s.model, guidance_rank(s.guidance), s.task, s.run_id)),
        groups=[group_score(m, g, groups[(m, g)])
                for m, g in sorted(groups, key=lambda k: (k[0], guidance_rank(k[1])))],
        excluded=dict(sorted(lacking.items())),
    )
