"""Candidates of recorded runs, read from the results store and cross-checked, and the final
candidate the scoring rule selects among them.

One reader for the agent runner (which records the final candidate), the judge (which
assesses it) and the reports (which score it), so all three see the same candidates and
apply the same rule (:func:`d2kbench.scoring.selection.final_candidate`).

Cross-checks: a candidate's ``eligible`` flag must agree with its evaluation's result rows,
and those rows must be of the candidate's own source (sha256). Only *complete* evaluations
count (docs/protocol.md, "Evaluation status"): a candidate whose evaluation is still running or
was interrupted is left out and named in :attr:`StoredCandidates.incomplete`.
"""

from __future__ import annotations

from collections import defaultdict

from pydantic import BaseModel

from d2kbench.scoring.metrics import ScoringError
from d2kbench.scoring.records import HELD_BACK_COPY, CandidateRecord
from d2kbench.scoring.selection import final_candidate
from d2kbench.scoring.sol import gpu_key


def hardware_of(env: dict) -> str:
    """The machine key of an evaluation: a ceiling-table key (``H200``), else the GPU name, else
    the device (``cpu``)."""
    gpu = env.get("gpu")
    return gpu_key(gpu) or gpu or env.get("device") or "unknown"


class StoredCandidates(BaseModel):
    """``by_run``: run_id -> [(candidate, hardware of its evaluation or None)], in (turn, id)
    order; ``incomplete``: run_id -> descriptions of candidates left out because their
    evaluation is not complete."""

    by_run: dict[str, list[tuple[CandidateRecord, str | None]]] = {}
    incomplete: dict[str, list[str]] = {}

    def records(self, run_id: str) -> list[CandidateRecord]:
        """The counted candidates of one run."""
        return [c for c, _ in self.by_run.get(run_id, [])]


def timed_latency(store, row) -> tuple[bool, float | None]:
    """(timed workload?, per-call mean ms or None when it did not pass) of a result row."""
    rec = store.result(row)
    return (not rec.correctness_only), (rec.timing.mean_ms if rec.timing and row["status"] == "ok" else None)


def stored_candidates(store, run_ids: list[str], hardware: dict[str, str] | None = None,
                      states: dict[str, str] | None = None) -> StoredCandidates:
    """The candidates of ``run_ids`` with their latencies (per-call means, ms, timed workloads).

    Args:
        store: an open :class:`d2kbench.store.Store`.
        run_ids: the runs.
        hardware: eval_id -> machine key (default: from the evaluations' environments).
        states: eval_id -> evaluation status (default: :meth:`Store.evaluation_states`).

    Raises:
        ScoringError: a candidate whose evaluation timed another source, whose ``eligible``
            flag disagrees with its results, or that is eligible without a timing.
    """
    out = StoredCandidates()
    if not run_ids:
        return out
    hw = hardware if hardware is not None else {e: hardware_of(env) for e, env in store.evaluation_envs().items()}
    states = states if states is not None else store.evaluation_states()
    cands = store.candidate_rows(run_ids)
    eval_ids = sorted({c["eval_id"] for c in cands if c["eval_id"]})
    rows_by_eval: dict[str, list] = defaultdict(list)
    for row in store.eval_rows(eval_ids) if eval_ids else []:
        if row["role"] == "candidate":
            rows_by_eval[row["eval_id"]].append(row)
    by_run: dict[str, list] = defaultdict(list)
    for c in cands:
        where = f"run {c['run_id']!r} candidate {c['id']} (turn {c['turn']})"
        if c["eval_id"] and states.get(c["eval_id"], "complete") != "complete":
            out.incomplete.setdefault(c["run_id"], []).append(
                f"candidate {c['id']} (turn {c['turn']}): evaluation {c['eval_id']} {states[c['eval_id']]}")
            continue
        rows = rows_by_eval.get(c["eval_id"], []) if c["eval_id"] else []
        for row in rows:
            if row["solution_sha256"] != c["solution_sha256"]:
                raise ScoringError(f"{where}: evaluation {c['eval_id']} timed source {row['solution_sha256'][:12]}, "
                                   f"not the candidate's {c['solution_sha256'][:12]}")
        # a copy of held-back code passes the checks but is not the agent's work: never eligible
        passed = bool(rows) and all(row["status"] == "ok" for row in rows) and c["status"] != HELD_BACK_COPY
        if bool(c["eligible"]) != passed:
            state = ("has no result rows" if not rows else
                     "passed every workload" if passed else "has failed workloads")
            raise ScoringError(f"{where}: marked eligible={bool(c['eligible'])} but its evaluation "
                               f"{c['eval_id']} {state}")
        lat = {}
        if passed:
            for row in rows:
                timed, ms = timed_latency(store, row)
                if timed:
                    if ms is None:
                        raise ScoringError(f"{where}: eligible but workload {row['workload']!r} has no timing")
                    lat[row["workload"]] = ms
        record = CandidateRecord(id=c["id"], turn=c["turn"], eligible=passed, latencies_ms=lat,
                                 sha256=c["solution_sha256"])
        by_run[c["run_id"]].append((record, hw.get(c["eval_id"]) if c["eval_id"] else None))
    out.by_run = dict(by_run)
    return out


def check_recorded_final(run_row, candidates: list[CandidateRecord]) -> CandidateRecord | None:
    """The final candidate of a settled run by the scoring rule, after checking that the store
    recorded the same one (``runs.final_candidate``).

    Raises:
        ScoringError: the recorded final candidate is not the one the rule selects (a store
            written with another selection rule, or candidates added after the run closed).
    """
    final = final_candidate(candidates, run_row["task"])
    recorded = run_row["final_candidate"]
    mine = final.id if final is not None else None
    if recorded != mine:
        raise ScoringError(
            f"run {run_row['run_id']!r}: the store records candidate {recorded} as the final answer, but the "
            f"final-selection rule (lowest geometric-mean latency among eligible candidates) selects {mine}; "
            "the run was recorded with another rule or its candidates changed after it closed")
    return final


def final_of_run(store, run_id: str) -> tuple[CandidateRecord | None, list[CandidateRecord]]:
    """(final candidate by the scoring rule or None, every counted candidate) of one run, from
    the store, without comparing it with the recorded one.

    Raises:
        ScoringError: as :func:`stored_candidates` and
            :func:`d2kbench.scoring.selection.final_candidate`.
    """
    row = store.run(run_id)
    cands = stored_candidates(store, [run_id]).records(run_id)
    return final_candidate(cands, row["task"] if row is not None else ""), cands
