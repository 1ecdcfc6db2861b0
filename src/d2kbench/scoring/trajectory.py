"""Trajectory score S'_perf over agent turns (docs/protocol.md, "Trajectory score").

At turn t a task counts :data:`FALLBACK_SCORE` (0.1) until its first eligible submission (a
candidate submitted at a turn <= t), then the best eligible task speedup so far; a best score
below 0.1 is used as measured, not raised to 0.1. S'_perf(t) of one model is the geometric mean
of these task values over its declared tasks (as S_perf aggregates tasks): a declared task
without a scored run counts 0.1 at every turn; across models, the geometric mean of the
per-model values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from pydantic import BaseModel

from d2kbench.scoring.metrics import ScoringError
from d2kbench.scoring.runs import RunScore
from d2kbench.scoring.speedup import geomean

#: What a task counts before its first eligible submission (docs/protocol.md).
FALLBACK_SCORE = 0.1


class Trajectory(BaseModel):
    """S'_perf at each turn of ``turns`` (``values[i]`` belongs to ``turns[i]``)."""

    turns: list[int]
    values: list[float]

    @property
    def final(self) -> float:
        """S'_perf at the last turn."""
        return self.values[-1]


def task_trajectory(eligible: Iterable[tuple[int, float]], turns: Sequence[int]) -> list[float]:
    """One task's value at each turn: 0.1 before its first eligible submission, then the best
    eligible score so far (as measured, also below 0.1).

    Args:
        eligible: (turn, task speedup) of each eligible submission, any order.
        turns: increasing turn indices to evaluate at.

    Raises:
        ScoringError: ``turns`` not strictly increasing, or a score that is not positive.
    """
    if any(b <= a for a, b in zip(turns, turns[1:])):
        raise ScoringError("trajectory turns must be strictly increasing")
    subs = sorted(eligible)
    for turn, score in subs:
        if not score > 0:
            raise ScoringError(f"turn {turn}: an eligible score must be positive, got {score!r}")
    out, best, i = [], None, 0
    for t in turns:
        while i < len(subs) and subs[i][0] <= t:
            best = subs[i][1] if best is None else max(best, subs[i][1])
            i += 1
        out.append(FALLBACK_SCORE if best is None else best)
    return out


def turn_grid(runs: Iterable[RunScore]) -> list[int]:
    """Turns 0 .. the largest turn budget (or submission turn) of ``runs``."""
    last = 0
    for r in runs:
        last = max(last, r.budget_turns, *(t for t, _ in r.eligible))
    return list(range(last + 1))


def trajectory(runs: Iterable[RunScore], turns: Sequence[int] | None = None,
               tasks: Iterable[str] | None = None) -> Trajectory:
    """S'_perf of one model (one run per task) at each turn: geometric mean over its tasks.

    Args:
        runs: the model's scored runs of one guidance setting.
        turns: the turn grid (default: :func:`turn_grid` of ``runs``).
        tasks: the declared tasks (default: the tasks of ``runs``); a declared task without a
            run counts :data:`FALLBACK_SCORE` at every turn.

    Raises:
        ScoringError: no runs and no declared tasks, two runs of one task, or a run of a task
            that is not declared.
    """
    runs = list(runs)
    declared = sorted(set(tasks)) if tasks is not None else sorted({r.task for r in runs})
    if not declared:
        raise ScoringError("trajectory of no tasks")
    names = [r.task for r in runs]
    dup = sorted({t for t in names if names.count(t) > 1})
    if dup:
        raise ScoringError(f"trajectory needs one run per task; several runs of {', '.join(dup)}")
    stray = sorted(set(names) - set(declared))
    if stray:
        raise ScoringError(f"trajectory: runs of undeclared task(s) {', '.join(stray)}")
    grid = list(turns) if turns is not None else turn_grid(runs)
    per_task = [task_trajectory(r.eligible, grid) for r in runs]
    per_task += [[FALLBACK_SCORE] * len(grid)] * (len(declared) - len(runs))
    return Trajectory(turns=grid, values=[geomean(col) for col in zip(*per_task)])


def overall_trajectory(per_model: Mapping[str, Trajectory]) -> Trajectory:
    """S'_perf across models at each turn: geometric mean of the per-model values.

    Raises:
        ScoringError: no models, or trajectories over different turn grids.
    """
    if not per_model:
        raise ScoringError("overall trajectory of no models")
    grids = {tuple(t.turns) for t in per_model.values()}
    if len(grids) != 1:
        raise ScoringError("per-model trajectories must share one turn grid")
    turns = list(next(iter(grids)))
    return Trajectory(turns=turns, values=[geomean(col) for col in zip(*(t.values for t in per_model.values()))])
