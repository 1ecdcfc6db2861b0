"""The trajectory score S'_perf: 0.1 until the first eligible submission, then the best so far."""

from __future__ import annotations

import pytest

from d2kbench.scoring.metrics import ScoringError
from d2kbench.scoring.runs import RunScore
from d2kbench.scoring.trajectory import (
    FALLBACK_SCORE,
    Trajectory,
    overall_trajectory,
    task_trajectory,
    trajectory,
    turn_grid,
)


def rs(task: str, eligible: list[tuple[int, float]], budget: int = 5, model: str = "m") -> RunScore:
    return RunScore(run_id=f"{model}-{task}", task=task, model=model, guidance="none", budget_turns=budget,
                    eligible=eligible)


def test_fallback_then_best_so_far():
    assert FALLBACK_SCORE == 0.1
    # first eligible at turn 2 (1.5), a worse one at 3 does not lower it, a better one at 5 raises it
    assert task_trajectory([(2, 1.5), (3, 0.9), (5, 3.0)], range(7)) == [0.1, 0.1, 1.5, 1.5, 1.5, 3.0, 3.0]
    assert task_trajectory([], [0, 1, 2]) == [0.1, 0.1, 0.1]
    # submissions in any order
    assert task_trajectory([(5, 3.0), (2, 1.5)], [1, 2, 5]) == [0.1, 1.5, 3.0]


def test_scores_below_the_fallback_are_used_as_measured():
    # a correct but very slow kernel lowers the task from 0.1 to 0.05: not clamped to 0.1
    assert task_trajectory([(3, 0.05)], range(5)) == [0.1, 0.1, 0.1, 0.05, 0.05]
    assert task_trajectory([(1, 0.05), (2, 0.08)], [0, 1, 2]) == [0.1, 0.05, 0.08]


def test_task_trajectory_rejects_bad_input():
    with pytest.raises(ScoringError, match="strictly increasing"):
        task_trajectory([(1, 1.0)], [0, 2, 2])
    with pytest.raises(ScoringError, match="turn 1: an eligible score must be positive"):
        task_trajectory([(1, 0.0)], [0, 1])


def test_model_trajectory_is_the_geomean_over_tasks():
    runs = [rs("t1", [(1, 4.0)], budget=3), rs("t2", [(2, 0.25), (3, 1.0)], budget=3)]
    tr = trajectory(runs)
    assert tr.turns == [0, 1, 2, 3] == turn_grid(runs)
    expected = [0.1, (4.0 * 0.1) ** 0.5, (4.0 * 0.25) ** 0.5, 2.0]
    assert tr.values == pytest.approx(expected, rel=1e-15)
    assert tr.final == 2.0
    with pytest.raises(ScoringError, match="several runs of t1"):
        trajectory(runs + [rs("t1", [])])
    with pytest.raises(ScoringError, match="no tasks"):
        trajectory([])
    with pytest.raises(ScoringError, match="undeclared task\\(s\\) t2"):
        trajectory(runs, tasks=["t1"])


def test_turn_grid_covers_late_submissions():
    assert turn_grid([rs("t", [(8, 1.0)], budget=5)]) == list(range(9))


def test_overall_trajectory_is_the_geomean_over_models():
    a = Trajectory(turns=[0, 1], values=[0.1, 4.0])
    b = Trajectory(turns=[0, 1], values=[0.1, 1.0])
    assert overall_trajectory({"a": a, "b": b}).values == pytest.approx([0.1, 2.0], rel=1e-15)
    with pytest.raises(ScoringError, match="share one turn grid"):
        overall_trajectory({"a": a, "c": Trajectory(turns=[0, 2], values=[0.1, 1.0])})
    with pytest.raises(ScoringError, match="no models"):
        overall_trajectory({})
