"""Which candidate of a run counts: the final answer and the first correct submission."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from d2kbench.scoring.metrics import task_speedup
from d2kbench.scoring.records import CandidateRecord


def first_correct(candidates: Iterable[CandidateRecord]) -> CandidateRecord | None:
    """The run's first eligible (fully correct) submission: lowest turn, then lowest id.

    This is the paper's baseline when taken from one fixed model's unguided run
    (SPEC.md section 3, "Speedup"). Returns None when no candidate is eligible.
    """
    eligible = [c for c in candidates if c.eligible]
    return min(eligible, key=lambda c: (c.turn, c.id)) if eligible else None


def eligible_speedups(candidates: Iterable[CandidateRecord], baseline_ms: Mapping[str, float],
                      task: str = "") -> list[tuple[CandidateRecord, float]]:
    """Every eligible candidate with its task speedup against ``baseline_ms`` (workload -> ms),
    in (turn, id) order.

    Raises:
        ScoringError / MissingBaselineError: from :func:`task_speedup` (workload sets that do
            not match the baseline's, or invalid latencies).
    """
    ordered = sorted((c for c in candidates if c.eligible), key=lambda c: (c.turn, c.id))
    return [(c, task_speedup(baseline_ms, c.latencies_ms, task)) for c in ordered]


def best_of(scored: Iterable[tuple[CandidateRecord, float]]) -> tuple[CandidateRecord, float] | None:
    """The highest speedup of ``(candidate, speedup)`` pairs; ties go to the earlier turn, then
    the lower id. None for no pairs."""
    scored = list(scored)
    if not scored:
        return None
    return max(scored, key=lambda cs: (cs[1], -cs[0].turn, -cs[0].id))


def select_final(candidates: Iterable[CandidateRecord], baseline_ms: Mapping[str, float],
                 task: str = "") -> tuple[CandidateRecord, float] | None:
    """The final answer of a run and its task speedup (SPEC.md section 3, "Final selection").

    Among eligible candidates, the one with the highest geometric-mean speedup over the task's
    workloads against ``baseline_ms``; ties go to the earlier turn, then the lower id. Since
    every candidate shares the baseline, the choice is (up to rounding) the same for any
    baseline: the candidate with the lowest geometric-mean latency. Returns None when no
    candidate is eligible (the task failed).

    Raises:
        ScoringError / MissingBaselineError: as :func:`eligible_speedups`.
    """
    return best_of(eligible_speedups(candidates, baseline_ms, task))
