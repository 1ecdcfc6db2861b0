"""Scoring arithmetic: verified scores, JS as the mean of the three levels, sample statistics."""

from __future__ import annotations

import pytest

from d2kbench.judge.scoring import judge_score, sample_stats, summarize, verified_score


def test_failed_verification_zeroes_the_level():
    assert verified_score(73.5, True) == 73.5
    assert verified_score(73.5, False) == 0.0


def test_js_is_the_equal_weight_mean():
    assert judge_score({"L1": 62, "L2": 70, "L3": 86}) == pytest.approx(72.666666, rel=1e-6)
    assert judge_score({"L1": 0, "L2": 0, "L3": 0}) == 0.0
    assert judge_score({"L1": 100, "L2": 100, "L3": 100}) == 100.0
    with pytest.raises(KeyError):
        judge_score({"L1": 1, "L2": 2})


def test_sample_statistics():
    s = sample_stats([70.0, 40.0, 55.0])
    assert (s.median, s.low, s.high, s.spread, s.n) == (55.0, 40.0, 70.0, 30.0, 3)
    assert sample_stats([10.0, 20.0]).median == 15.0
    with pytest.raises(ValueError):
        sample_stats([])


def test_summarize_computes_js_per_sample_then_the_median():
    stats = summarize([{"L1": 90, "L2": 60, "L3": 30}, {"L1": 0, "L2": 60, "L3": 30}, {"L1": 90, "L2": 90, "L3": 0}])
    assert stats["L1"].median == 90 and stats["L1"].spread == 90
    # JS per sample: 60, 30, 60 -> median 60 (not the JS of the medians, 60 as well here by chance)
    assert [stats["JS"].low, stats["JS"].median, stats["JS"].high] == [30, 60, 60]
