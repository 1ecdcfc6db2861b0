"""Which candidate of a run counts: the final answer and the first correct submission.

This module holds the project's one final-selection rule (docs/protocol.md, "Final
selection"). The agent runner records it in the store, scoring recomputes it, the judge
assesses the candidate it names (by content hash), and a store whose recorded final disagrees
with it is an error, never a silent choice.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from d2kbench.scoring.metrics import ScoringError, task_speedup
from d2kbench.scoring.records import CandidateRecord
from d2kbench.scoring.speedup import geomean


def first_correct(candidates: Iterable[CandidateRecord]) -> CandidateRecord | None:
    """The run's first eligible (fully correct) submission: lowest turn, then lowest id.

    This is the paper's baseline when taken from one fixed model's unguided run
    (docs/protocol.md, "Baseline"). Returns None when no candidate is eligible.
    """
    eligible = [c for c in candidates if c.eligible]
    return min(eligible, key=lambda c: (c.turn, c.id)) if eligible else None


def geomean_latency(candidate: CandidateRecord, task: str = "") -> float:
    """Geometric mean (ms) of an eligible candidate's per-call mean latencies over the task's
    timed workloads.

    Raises:
        ScoringError: no latencies, or a latency that is not a finite positive number (the
            message names the task, candidate and workload).
    """
    where = f"task {task!r} candidate {candidate.id} (turn {candidate.turn})"
    if not candidate.latencies_ms:
        raise ScoringError(f"{where}: eligible but has no timed workloads")
    for wl, ms in candidate.latencies_ms.items():
        if not (isinstance(ms, (int, float)) and math.isfinite(ms) and ms > 0):
            raise ScoringError(f"{where} workload {wl!r}: latency must be a finite positive number of ms, got {ms!r}")
    return geomean(candidate.latencies_ms.values())


def final_candidate(candidates: Iterable[CandidateRecord], task: str = "") -> CandidateRecord | None:
    """The final answer of a run (docs/protocol.md, "Final selection").

    Among eligible candidates, the one with the lowest geometric-mean latency over the task's
    timed workloads; ties go to the earlier turn, then the lower id. Against any one fixed
    baseline the task speedup is geomean(baseline) / geomean(candidate), so this is the
    candidate with the highest geometric-mean speedup, whatever the baseline. Speedups that
    each candidate's own evaluation measured against a re-timed baseline play no part: they
    differ from evaluation to evaluation by the baseline's noise. Returns None when no
    candidate is eligible (the task failed).

    Raises:
        ScoringError: eligible candidates timed on different workload sets (their geomeans
            are not comparable), or as :func:`geomean_latency`.
    """
    eligible = sorted((c for c in candidates if c.eligible), key=lambda c: (c.turn, c.id))
    if not eligible:
        return None
    sets = {frozenset(c.latencies_ms) for c in eligible}
    if len(sets) > 1:
        desc = "; ".join(f"candidate {c.id}: {', '.join(sorted(c.latencies_ms)) or 'none'}" for c in eligible)
        raise ScoringError(f"task {task!r}: eligible candidates were timed on different workloads ({desc})")
    return min(eligible, key=lambda c: (geomean_latency(c, task), c.turn, c.id))


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


def select_final(candidates: Iterable[CandidateRecord], baseline_ms: Mapping[str, float],
                 task: str = "") -> tuple[CandidateRecord, float] | None:
    """The final answer of a run (:func:`final_candidate`) and its task speedup against
    ``baseline_ms`` (workload -> ms). None when no candidate is eligible.

    Raises:
        ScoringError / MissingBaselineError: as :func:`final_candidate` and
            :func:`d2kbench.scoring.metrics.task_speedup`.
    """
    final = final_candidate(candidates, task)
    return None if final is None else (final, task_speedup(baseline_ms, final.latencies_ms, task))
