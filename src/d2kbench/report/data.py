"""Load what scores and reports need from the results store, as plain data.

Reads the ``runs``, ``candidates``, ``results``, ``evaluations``, ``turns`` and ``verdicts``
tables and cross-checks them: a candidate's ``eligible`` flag must agree with its evaluation's
result rows, and those rows must be of the candidate's own source (sha256). Latencies are
per-call means (ms) from the result rows; a task solution timed in several evaluations gets the
mean of its per-evaluation means, from the newest version (sha256) of its file only.

All results of one report come from one machine (``hardware``: ``H200``, ``cpu``, ...): a store
holding several asks the caller to choose.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from pydantic import BaseModel

from d2kbench.scoring.baseline import SOLUTION_BASELINES, BaselineSpec
from d2kbench.scoring.metrics import ScoringError
from d2kbench.scoring.records import UNGUIDED, CandidateRecord, RunRecord
from d2kbench.scoring.sol import gpu_key
from d2kbench.store import Store


class Selection(BaseModel):
    """Filters of a report or score: each list matches any of its values; None matches all."""

    campaigns: list[str] | None = None
    tasks: list[str] | None = None
    models: list[str] | None = None
    guidance: list[str] | None = None
    seeds: list[int] | None = None

    def describe(self) -> str:
        """The filters in one line (``all runs`` without any)."""
        parts = [f"{k}={','.join(map(str, v))}" for k, v in self.model_dump().items() if v]
        return "; ".join(parts) or "all runs"


class SolutionTiming(BaseModel):
    """A task solution's timing on one workload, over every evaluation of its newest version.

    ``mean_ms``: the mean of the per-evaluation per-call means (None when no evaluation passed).
    """

    sha256: str
    mean_ms: float | None
    n_ok: int
    n_failed: int
    last_status: str
    last_cause: str = ""


class Usage(BaseModel):
    """Summed token usage of one run (SPEC.md section 3, "Token accounting")."""

    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read: int = 0
    cache_write: int = 0
    cost_usd: float = 0.0


class Verdict(BaseModel):
    """One judge verdict row (SPEC.md section 5): scores 0-100 per level and their mean ``js``."""

    kind: str
    task: str
    target: str
    judge_model: str
    l1: float
    l2: float
    l3: float
    js: float


class ReportData(BaseModel):
    """Everything a score or report reads from the store, for one machine and one selection.

    ``runs``: the selected runs that have settled (see :func:`settled`); ``skipped``: run_id ->
    why a selected run was left out. ``pool``: runs a ``run:``/``model:`` baseline may come from.
    ``solutions``: task -> solution -> workload -> timing, of the timed workloads.
    """

    store: str
    hardware: str
    selection: Selection
    tasks: list[str]
    runs: list[RunRecord]
    pool: list[RunRecord]
    skipped: dict[str, str] = {}
    skipped_usage: Usage = Usage()
    solutions: dict[str, dict[str, dict[str, SolutionTiming]]] = {}
    usage: dict[str, Usage] = {}
    verdicts: list[Verdict] = []
    env: dict = {}

    def solution_ms(self) -> dict[str, dict[str, dict[str, float]]]:
        """task -> solution -> workload -> mean latency (ms), workloads without one left out."""
        return {t: {s: {w: v.mean_ms for w, v in wls.items() if v.mean_ms is not None} for s, wls in sols.items()}
                for t, sols in self.solutions.items()}


def hardware_of(env: dict) -> str:
    """The machine key of an evaluation: a ceiling-table key (``H200``), else the GPU name, else
    the device (``cpu``)."""
    gpu = env.get("gpu")
    return gpu_key(gpu) or gpu or env.get("device") or "unknown"


def _timed(store: Store, row) -> tuple[bool, float | None]:
    """(timed workload?, per-call mean ms) of a result row."""
    rec = store.result(row)
    return (not rec.correctness_only), (rec.timing.mean_ms if rec.timing and row["status"] == "ok" else None)


def _candidates(store: Store, run_rows, hw: dict[str, str]) -> dict[str, list[tuple[CandidateRecord, str | None]]]:
    """run_id -> [(candidate, hardware of its evaluation)], cross-checked against result rows."""
    run_ids = [r["run_id"] for r in run_rows]
    cands = store.candidate_rows(run_ids) if run_ids else []
    eval_ids = sorted({c["eval_id"] for c in cands if c["eval_id"]})
    rows_by_eval: dict[str, list] = defaultdict(list)
    for row in store.eval_rows(eval_ids) if eval_ids else []:
        if row["role"] == "candidate":
            rows_by_eval[row["eval_id"]].append(row)
    out: dict[str, list] = defaultdict(list)
    for c in cands:
        where = f"run {c['run_id']!r} candidate {c['id']} (turn {c['turn']})"
        rows = rows_by_eval.get(c["eval_id"], []) if c["eval_id"] else []
        for row in rows:
            if row["solution_sha256"] != c["solution_sha256"]:
                raise ScoringError(f"{where}: evaluation {c['eval_id']} timed source {row['solution_sha256'][:12]}, "
                                   f"not the candidate's {c['solution_sha256'][:12]}")
        passed = bool(rows) and all(row["status"] == "ok" for row in rows)
        if bool(c["eligible"]) != passed:
            state = ("has no result rows" if not rows else
                     "passed every workload" if passed else "has failed workloads")
            raise ScoringError(f"{where}: marked eligible={bool(c['eligible'])} but its evaluation "
                               f"{c['eval_id']} {state}")
        lat = {}
        if passed:
            for row in rows:
                timed, ms = _timed(store, row)
                if timed:
                    if ms is None:
                        raise ScoringError(f"{where}: eligible but workload {row['workload']!r} has no timing")
                    lat[row["workload"]] = ms
        record = CandidateRecord(id=c["id"], turn=c["turn"], eligible=passed, latencies_ms=lat,
                                 sha256=c["solution_sha256"])
        out[c["run_id"]].append((record, hw.get(c["eval_id"]) if c["eval_id"] else None))
    return out


#: Run statuses that are not (yet) a result: the run may still submit, or it died and is retried.
UNSETTLED = ("running", "interrupted")


def settled(rows) -> tuple[list, dict[str, str]]:
    """The runs that count, and run_id -> why each other one is left out.

    A run still ``running`` or ``interrupted`` is left out; of several attempts at one planned run
    (rows sharing ``run_key``) only the latest settled attempt counts.
    """
    latest: dict[str, object] = {}
    skipped: dict[str, str] = {}
    for row in rows:
        if row["status"] in UNSETTLED:
            skipped[row["run_id"]] = row["status"]
            continue
        key = row["run_key"] or row["run_id"]
        other = latest.get(key)
        if other is not None and other["attempt"] > row["attempt"]:
            row, other = other, row
        if other is not None:
            skipped[other["run_id"]] = f"attempt {other['attempt']}, superseded by {row['run_id']}"
        latest[key] = row
    return list(latest.values()), dict(sorted(skipped.items()))


def _run_record(row, cands: list[CandidateRecord]) -> RunRecord:
    return RunRecord(run_id=row["run_id"], task=row["task"], model=row["model"], guidance=row["guidance"],
                     campaign=row["campaign"], backend=row["backend"], seed=row["seed"],
                     budget_turns=row["budget_turns"], status=row["status"], candidates=cands)


def _solutions(store: Store, rows, hardware: str, hw: dict[str, str]) -> dict:
    """task -> solution -> workload -> SolutionTiming, from the newest sha256 of each solution."""
    by_sol: dict[tuple[str, str], list] = defaultdict(list)
    for row in rows:
        if hw.get(row["eval_id"]) == hardware:
            by_sol[(row["task"], row["solution"])].append(row)
    out: dict[str, dict[str, dict[str, SolutionTiming]]] = defaultdict(dict)
    for (task, sol), srows in sorted(by_sol.items()):
        newest = max(srows, key=lambda r: r["id"])["solution_sha256"]
        per_wl: dict[str, list] = defaultdict(list)
        for row in srows:
            if row["solution_sha256"] == newest:
                per_wl[row["workload"]].append(row)
        timings = {}
        for wl, wrows in sorted(per_wl.items()):
            parsed = [_timed(store, r) for r in wrows]
            if not any(timed for timed, _ in parsed):
                continue  # a correctness-only workload
            means = [ms for _, ms in parsed if ms is not None]
            last = max(wrows, key=lambda r: r["id"])
            timings[wl] = SolutionTiming(sha256=newest, mean_ms=sum(means) / len(means) if means else None,
                                         n_ok=len(means), n_failed=len(wrows) - len(means),
                                         last_status=last["status"], last_cause=last["cause"])
        if timings:
            out[task][sol] = timings
    return dict(out)


def load(store: Store, selection: Selection | None = None, hardware: str | None = None,
         baseline: BaselineSpec | None = None) -> ReportData:
    """Read the selected runs, the task solutions' timings, usage and verdicts from ``store``.

    Args:
        store: an open store.
        selection: run filters (default: every run).
        hardware: the machine whose results to use (``H200``, ``cpu``, a GPU name); default: the
            only one the selection's results come from.
        baseline: where ``run:``/``model:`` baselines are read from (the pool of runs).

    Raises:
        ScoringError: results from several machines and no ``hardware``; inconsistent candidate
            rows (see the module docstring); a run whose candidates ran on different machines.
    """
    sel = selection or Selection()
    envs = store.evaluation_envs()
    hw = {eid: hardware_of(env) for eid, env in envs.items()}
    run_rows, skipped = settled(store.run_rows(sel.campaigns, sel.tasks, sel.models, sel.guidance, sel.seeds))
    pool_rows = []
    if baseline is not None and baseline.kind == "model":
        pool_rows = store.run_rows(sel.campaigns, sel.tasks, [baseline.name], [UNGUIDED], sel.seeds)
    elif baseline is not None and baseline.kind == "run":
        pool_rows = store.run_rows(run_ids=[baseline.name])
    pool_rows = settled(pool_rows)[0]
    all_rows = {r["run_id"]: r for r in [*run_rows, *pool_rows]}
    cands = _candidates(store, list(all_rows.values()), hw)
    tasks = sel.tasks or sorted({r["task"] for r in run_rows})
    sol_rows = store.solution_rows(list(SOLUTION_BASELINES), tasks or None)
    seen = {h for cs in cands.values() for _, h in cs if h} | {hw[r["eval_id"]] for r in sol_rows if r["eval_id"] in hw}
    if hardware is None:
        if len(seen) > 1:
            raise ScoringError(f"the selection holds results from several machines ({', '.join(sorted(seen))}): "
                               "choose one (--hardware)")
        hardware = next(iter(seen)) if seen else "unknown"
    else:
        hardware = gpu_key(hardware) or hardware
    if not tasks:
        tasks = sorted({r["task"] for r in sol_rows if hw.get(r["eval_id"]) == hardware})

    def records(rows) -> list[RunRecord]:
        out = []
        for row in rows:
            machines = {h for _, h in cands.get(row["run_id"], []) if h}
            if len(machines) > 1:
                raise ScoringError(f"run {row['run_id']!r}: candidates evaluated on several machines "
                                   f"({', '.join(sorted(machines))})")
            if machines and machines != {hardware}:
                continue  # a run on another machine
            out.append(_run_record(row, [c for c, _ in cands.get(row["run_id"], [])]))
        return out

    runs = records(run_rows)
    counted = {r.run_id for r in runs}
    usage: dict[str, Usage] = {}
    left_out = Usage()
    for t in store.turn_rows(sorted(counted | set(skipped))):
        u = usage.setdefault(t["run_id"], Usage()) if t["run_id"] in counted else left_out
        u.turns += 1
        u.input_tokens += t["input_tokens"]
        u.output_tokens += t["output_tokens"]
        u.cache_read += t["cache_read"]
        u.cache_write += t["cache_write_5m"] + t["cache_write_1h"]
        u.cost_usd += t["cost_usd"]
    verdicts = [Verdict(kind=v["kind"], task=v["task"], target=v["target"], judge_model=v["model"], l1=v["l1"],
                        l2=v["l2"], l3=v["l3"], js=v["js"]) for v in store.verdict_rows(tasks or None)]
    newest_env = {}
    on_hw = [(envs[e].get("time_utc") or "", e) for e in envs if hw[e] == hardware]
    if on_hw:
        newest_env = envs[max(on_hw)[1]]
    return ReportData(
        store=Path(store.path).name, hardware=hardware, selection=sel, tasks=tasks,
        runs=runs, skipped=skipped, skipped_usage=left_out, pool=records(pool_rows),
        solutions=_solutions(store, sol_rows, hardware, hw), usage=usage,
        verdicts=verdicts, env=newest_env,
    )
