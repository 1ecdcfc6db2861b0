"""Judge scores: verified level scores, JS, and statistics over repeated samples.

A level keeps the judge's score only when its evidence verified; otherwise it scores 0.
JS is the equal-weight mean of the three verified level scores (docs/protocol.md, "Judge";
no caps, no pass/fail). With several samples per subject the reported figure is the median, with the
spread (max - min) as a health measure of the judge.
"""

from __future__ import annotations

import statistics

from pydantic import BaseModel

from d2kbench.judge.verdict import LEVELS


def verified_score(raw_score: float, verified: bool) -> float:
    """The score a level keeps: ``raw_score`` when its evidence verified, else 0."""
    return float(raw_score) if verified else 0.0


def judge_score(levels: dict[str, float]) -> float:
    """JS: the mean of the L1, L2 and L3 scores.

    Raises:
        KeyError: a level is missing.
    """
    return sum(float(levels[lvl]) for lvl in LEVELS) / len(LEVELS)


class SampleStats(BaseModel):
    """Median and spread of one figure over samples."""

    median: float
    low: float
    high: float
    spread: float
    n: int


def sample_stats(values: list[float]) -> SampleStats:
    """Median, minimum, maximum and spread (max - min) of ``values``.

    Raises:
        ValueError: no values.
    """
    if not values:
        raise ValueError("no samples")
    lo, hi = min(values), max(values)
    return SampleStats(median=statistics.median(values), low=lo, high=hi, spread=hi - lo, n=len(values))


def summarize(samples: list[dict[str, float]]) -> dict[str, SampleStats]:
    """Per level and for ``JS``: statistics over samples of ``{"L1", "L2", "L3", "JS"}`` scores
    (``JS`` is computed from the levels when absent)."""
    rows = [{**s, "JS": s.get("JS", judge_score(s))} for s in samples]
    return {k: sample_stats([r[k] for r in rows]) for k in (*LEVELS, "JS")}
