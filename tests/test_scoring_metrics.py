"""S_perf, fast_p and task speedups on hand-computed examples (docs/protocol.md, "Scores")."""

from __future__ import annotations

import math

import pytest

from d2kbench.scoring.metrics import (
    FAILED_TASK_SCORE,
    FAST_P_THRESHOLDS,
    MissingBaselineError,
    ScoringError,
    fast_p,
    overall_performance_score,
    performance_score,
    task_speedup,
)
from d2kbench.scoring.speedup import geomean


def test_task_speedup_is_the_geomean_over_workloads():
    # speedups 4 and 9 -> geomean 6 (not the arithmetic mean 6.5, not the ratio of sums 13/2)
    assert task_speedup({"a": 4.0, "b": 9.0}, {"a": 1.0, "b": 1.0}) == pytest.approx(6.0, rel=1e-15)
    # a slower candidate: speedups 0.5 and 2 -> 1
    assert task_speedup({"a": 1.0, "b": 4.0}, {"a": 2.0, "b": 2.0}) == pytest.approx(1.0, rel=1e-15)


def test_task_speedup_missing_baseline_workload_names_it():
    with pytest.raises(MissingBaselineError, match="no baseline latency for workload\\(s\\) b") as e:
        task_speedup({"a": 1.0}, {"a": 1.0, "b": 1.0}, task="t")
    assert e.value.missing == {"t": "no baseline latency for workload(s) b"}
    with pytest.raises(MissingBaselineError, match="no timed workloads"):
        task_speedup({}, {"a": 1.0}, task="t")


def test_task_speedup_candidate_lacking_a_workload_fails():
    with pytest.raises(ScoringError, match="candidate has no latency for workload\\(s\\) b"):
        task_speedup({"a": 1.0, "b": 2.0}, {"a": 1.0}, task="t")


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_task_speedup_zero_or_invalid_baseline_is_a_clear_error(bad):
    with pytest.raises(ScoringError, match="task 't' workload 'b': baseline latency must be a finite positive"):
        task_speedup({"a": 1.0, "b": bad}, {"a": 1.0, "b": 1.0}, task="t")
    with pytest.raises(ScoringError, match="task 't' workload 'a': candidate latency"):
        task_speedup({"a": 1.0}, {"a": bad}, task="t")


def test_failed_task_contributes_exactly_half():
    assert FAILED_TASK_SCORE == 0.5
    # geomean(2, 0.5) = 1: a failure must neither be skipped (-> 2) nor count 0 / 0.1
    assert performance_score({"t1": 2.0, "t2": None}) == pytest.approx(1.0, rel=1e-15)
    # geomean(8, 0.5, 0.5) = 2 ** (1/3)
    assert performance_score({"t1": 8.0, "t2": None, "t3": None}) == pytest.approx(2 ** (1 / 3), rel=1e-15)
    assert performance_score({"t1": None}) == 0.5


def test_performance_score_rejects_bad_input():
    with pytest.raises(ScoringError, match="S_perf of no tasks"):
        performance_score({})
    for bad in (0.0, -2.0, math.nan, "2"):
        with pytest.raises(ScoringError, match="task 'x': speedup must be"):
            performance_score({"ok": 1.0, "x": bad})


def test_overall_is_the_geomean_over_models():
    assert overall_performance_score({"m1": 2.0, "m2": 8.0}) == pytest.approx(4.0, rel=1e-15)
    assert overall_performance_score({"m1": 1.46}) == 1.46
    with pytest.raises(ScoringError, match="no models"):
        overall_performance_score({})
    with pytest.raises(ScoringError, match="model 'm2'"):
        overall_performance_score({"m1": 1.0, "m2": 0.0})


def test_fast_p_is_strict_and_counts_failed_tasks():
    speedups = {"a": 2.0, "b": 1.5, "c": 1.0, "d": None}
    assert FAST_P_THRESHOLDS == (1.0, 1.5, 2.0)
    # speedup == p is not faster than p; the failed task stays in the denominator (4)
    assert fast_p(speedups, 1.0) == 2 / 4
    assert fast_p(speedups, 1.5) == 1 / 4
    assert fast_p(speedups, 2.0) == 0.0
    assert fast_p({"a": 2.0000001}, 2.0) == 1.0
    assert fast_p({"a": None, "b": None}, 0.0) == 0.0


def test_fast_p_rejects_bad_input():
    with pytest.raises(ScoringError, match="fast_p of no tasks"):
        fast_p({}, 1.0)
    for p in (-1.0, math.nan, None):
        with pytest.raises(ScoringError, match="threshold"):
            fast_p({"a": 1.0}, p)
    with pytest.raises(ScoringError, match="task 'a'"):
        fast_p({"a": -1.0}, 1.0)


def test_geomean_is_exact_in_log_space():
    assert geomean([1e-300, 1e300]) == pytest.approx(1.0)  # a product would underflow/overflow
    with pytest.raises(ValueError, match="no values"):
        geomean([])
    with pytest.raises(ValueError, match="finite positive"):
        geomean([1.0, 0.0])
