"""Speedup and geometric means (docs/protocol.md)."""

from __future__ import annotations

import math
from collections.abc import Iterable


def speedup(baseline_ms: float, candidate_ms: float) -> float:
    """Baseline latency over candidate latency (both in ms; > 1 means faster).

    Raises:
        ValueError: a latency that is not a finite positive number.
    """
    for name, v in (("baseline", baseline_ms), ("candidate", candidate_ms)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ValueError(f"{name} latency must be a finite positive number of ms, got {v!r}")
    return baseline_ms / candidate_ms


def geomean(values: Iterable[float]) -> float:
    """Geometric mean of positive numbers: exp of the mean of the logs (docs/protocol.md).

    The log sum is exactly rounded (``math.fsum``), so the result does not depend on the
    order of ``values`` (reordering tasks or models changes nothing, to the last bit).

    Raises:
        ValueError: empty input or a value <= 0 / not finite.
    """
    vals = list(values)
    if not vals:
        raise ValueError("geomean of no values")
    for v in vals:
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"geomean needs finite positive values, got {v!r}")
    return math.exp(math.fsum(math.log(v) for v in vals) / len(vals))
