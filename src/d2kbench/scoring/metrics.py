"""Task speedup, Performance Score S_perf and fast_p (docs/protocol.md).

Inputs are plain mappings (workload -> latency in ms, task -> task speedup); a task speedup of
``None`` means the task's final submission failed. Every result is a full-precision float;
rounding happens only when a report prints it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from d2kbench.scoring.speedup import geomean, speedup

#: A task whose final submission fails contributes this to S_perf (docs/protocol.md).
FAILED_TASK_SCORE = 0.5
#: The thresholds fast_p is reported at (docs/protocol.md).
FAST_P_THRESHOLDS = (1.0, 1.5, 2.0)


class ScoringError(ValueError):
    """Scores cannot be computed from these inputs; the message names the task, workload or run."""


class MissingBaselineError(ScoringError):
    """No usable baseline latency for some tasks (or workloads); ``missing``: task -> reason."""

    def __init__(self, missing: Mapping[str, str]):
        self.missing = dict(missing)
        super().__init__("no baseline for " + "; ".join(f"task {t!r}: {r}" for t, r in self.missing.items()))


def task_speedup(baseline_ms: Mapping[str, float], candidate_ms: Mapping[str, float], task: str = "") -> float:
    """Task-level speedup: geometric mean over workloads of baseline / candidate latency.

    docs/protocol.md ("Baseline", "Scores": geometric mean over workloads within a
    task). Both mappings go from workload id to the per-call mean latency in ms, and must cover
    the same workloads: a geomean over a different workload set is not comparable.

    Raises:
        MissingBaselineError: a candidate workload without a baseline latency, or no workloads.
        ScoringError: a baseline workload the candidate has no latency for, or a latency that is
            not a finite positive number (zero included); the message names task and workload.
    """
    if not baseline_ms:
        raise MissingBaselineError({task: "the baseline has no timed workloads"})
    missing = sorted(set(candidate_ms) - set(baseline_ms))
    if missing:
        raise MissingBaselineError({task: f"no baseline latency for workload(s) {', '.join(missing)}"})
    lacking = sorted(set(baseline_ms) - set(candidate_ms))
    if lacking:
        raise ScoringError(f"task {task!r}: the candidate has no latency for workload(s) {', '.join(lacking)}")
    ratios = []
    for wl in sorted(baseline_ms):
        try:
            ratios.append(speedup(baseline_ms[wl], candidate_ms[wl]))
        except ValueError as e:
            raise ScoringError(f"task {task!r} workload {wl!r}: {e}") from None
    return geomean(ratios)


def _checked(task_speedups: Mapping[str, float | None], what: str) -> None:
    if not task_speedups:
        raise ScoringError(f"{what} of no tasks")
    for task, s in task_speedups.items():
        if s is not None and not (isinstance(s, (int, float)) and math.isfinite(s) and s > 0):
            raise ScoringError(f"task {task!r}: speedup must be a finite positive number or None (failed), got {s!r}")


def performance_score(task_speedups: Mapping[str, float | None]) -> float:
    """S_perf of one model: geometric mean over tasks of the task speedups, where a failed task
    (``None``) contributes the fixed :data:`FAILED_TASK_SCORE` 0.5 (docs/protocol.md).

    Raises:
        ScoringError: no tasks, or a speedup that is neither None nor finite and positive.
    """
    _checked(task_speedups, "S_perf")
    return geomean(FAILED_TASK_SCORE if s is None else s for s in task_speedups.values())


def overall_performance_score(model_scores: Mapping[str, float]) -> float:
    """Overall S_perf across models: geometric mean of the per-model S_perf (docs/protocol.md).

    Raises:
        ScoringError: no models, or a score that is not finite and positive.
    """
    if not model_scores:
        raise ScoringError("overall S_perf of no models")
    for model, s in model_scores.items():
        if not (isinstance(s, (int, float)) and math.isfinite(s) and s > 0):
            raise ScoringError(f"model {model!r}: S_perf must be a finite positive number, got {s!r}")
    return geomean(model_scores.values())


def fast_p(task_speedups: Mapping[str, float | None], p: float) -> float:
    """fast_p: the fraction of *all* tasks whose task speedup is strictly greater than ``p``.

    docs/protocol.md: the denominator is the number of tasks, failed ones (``None``) included;
    a failed task never counts as fast. Returns a fraction in [0, 1].

    Raises:
        ScoringError: no tasks, a bad speedup, or ``p`` not finite and non-negative.
    """
    if not (isinstance(p, (int, float)) and math.isfinite(p) and p >= 0):
        raise ScoringError(f"fast_p threshold must be a finite number >= 0, got {p!r}")
    _checked(task_speedups, "fast_p")
    fast = sum(1 for s in task_speedups.values() if s is not None and s > p)
    return fast / len(task_speedups)
