"""Trajectory score S'_perf over agent turns (SPEC.md section 3, token-efficiency figure).

At turn t a task counts :data:`FALLBACK_SCORE` (0.1) until its first eligible submission (a
candidate submitted at a turn <= t), then the best eligible task speedup so far; a best score
below 0.1 is used as measured, not raised to 0.1. S'_perf(t) of one model is the geometric mean
of these task values over its tasks (as S_perf aggregates tasks); across models, the geometric
mean of the per-model values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from pydantic import BaseModel

from d2kbench.scoring.metrics import ScoringError
from d2kbench.scoring.runs import RunScore
from d2kbench.scoring.speedup import geomean

#: What a task counts before its first eligible submission (SPEC.md section 3).
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


def trajectory(runs: Iterable[RunScore], turns: Sequence[int] | None = None) -> Trajectory:
    """S'_perf of one model (one run per task) at each turn: geometric mean over its tasks.

    Raises:
        ScoringError: no runs, or two runs of one task.
    """
    runs = list(runs)
    if not runs:
        raise ScoringError("trajectory of no runs")
    tasks = [r.task for r in runs]
    dup = sorted({t for t in tasks if tasks.count(t) > 1})
    if dup:
        raise ScoringError(f"trajectory needs one run per task; several runs of {', '.join(dup)}")
    grid = list(turns) if turns is not None else turn_grid(runs)
    per_task = [task_trajectory(r.eligible, grid) for r in runs]
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
