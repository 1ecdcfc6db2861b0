"""Load what scores and reports need from the results store, as plain data.

Reads the ``runs``, ``candidates``, ``results``, ``evaluations``, ``turns``, ``verdicts`` and
``campaigns`` tables. Candidates come from :func:`d2kbench.scoring.stored.stored_candidates`
(cross-checked against their evaluations); the final candidate the store records for a run
must be the one the scoring rule selects. Latencies are per-call means (ms) from the result
rows; a task solution timed in several evaluations gets the mean of its per-evaluation means,
from the newest version (sha256) of its file only. Only complete evaluations are used; the
others are counted in :attr:`ReportData.incomplete_evaluations`.

The tasks of every score are declared (:class:`d2kbench.scoring.runs.TaskSet`): the
``--task`` selection, else the plans of the selected campaigns (recorded in the store when a
campaign runs), else the suite. A declared task without a scored run counts as failed.

All results of one report come from one machine (``hardware``: ``H200``, ``cpu``, ...): a store
holding several asks the caller to choose.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from d2kbench.campaign.plan import Plan
from d2kbench.scoring.baseline import SOLUTION_BASELINES, BaselineSpec
from d2kbench.scoring.metrics import ScoringError
from d2kbench.scoring.records import DESIGN, DESIGNS, HELD_BACK_COPY, UNGUIDED, CandidateRecord, RunRecord
from d2kbench.scoring.runs import DeclaredGroup, LeftOut, TaskSet
from d2kbench.scoring.sol import gpu_key
from d2kbench.scoring.stored import check_recorded_final, hardware_of, stored_candidates, timed_latency
from d2kbench.store import Store
from d2kbench.tasks import list_tasks

__all__ = ["ReportData", "Selection", "SolutionTiming", "Usage", "Verdict", "hardware_of", "load", "settled",
           "declared_tasks"]


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
    """A task solution's timing on one workload, over every complete evaluation of its newest
    version.

    ``mean_ms``: the mean of the per-evaluation per-call means (None when no evaluation passed).
    """

    sha256: str
    mean_ms: float | None
    n_ok: int
    n_failed: int
    last_status: str
    last_cause: str = ""


class Usage(BaseModel):
    """Summed token usage of one run or of several (docs/protocol.md, "Token accounting").

    ``cost_usd`` is None (unknown) when any summed turn is of a model without a price;
    ``unpriced_models`` names those models.
    """

    runs: int = 0
    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read: int = 0
    cache_write: int = 0
    cost_usd: float | None = 0.0
    unpriced_models: list[str] = []

    def add(self, other: Usage) -> None:
        """Add ``other`` into this sum (an unknown cost makes the sum's cost unknown)."""
        for f in ("runs", "turns", "input_tokens", "output_tokens", "cache_read", "cache_write"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.cost_usd = None if self.cost_usd is None or other.cost_usd is None else self.cost_usd + other.cost_usd
        self.unpriced_models = sorted({*self.unpriced_models, *other.unpriced_models})


class Verdict(BaseModel):
    """One judge verdict row (docs/protocol.md, "Judge"): scores 0-100 per level and their
    mean ``js``, and which judge gave it (model, prompt version, rubric version).

    ``candidate_sha256``: the source hash of the judged candidate as the verdict records it
    (its target for verdicts of a run's final candidate; from the verdict's subject for older
    verdicts that targeted a run id).
    """

    kind: str
    task: str
    target: str
    judge_model: str
    prompt_version: str = ""
    rubric_version: str = ""
    status: str = "judged"
    candidate_sha256: str = ""
    l1: float
    l2: float
    l3: float
    js: float

    @property
    def judge(self) -> tuple[str, str, str]:
        """The judge configuration verdicts are grouped by: (model, prompt, rubric version)."""
        return self.judge_model, self.prompt_version, self.rubric_version


class ReportData(BaseModel):
    """Everything a score or report reads from the store, for one machine and one selection.

    ``runs``: the selected runs that have settled (see :func:`settled`) on this machine;
    ``skipped``: run_id -> why a selected run was left out; ``left_out``: the same runs with
    their (task, model, guidance), which name why a declared task is missing. ``pool``: runs a
    ``run:``/``model:`` baseline may come from. ``declared``: the declared tasks of every
    score; ``tasks``: every declared task. ``solutions``: task -> solution -> workload ->
    timing, of the timed workloads. ``incomplete_evaluations``: status -> number of
    evaluations left out because they are not complete (``incomplete_by_task``: the same per
    task). ``held_back_copies``: run_id -> ids of
    candidates that reproduce a task's held-back solution (never eligible, so in no score).
    ``borrowed``: run_id -> campaign, for counted runs filed under another campaign than the
    selected ones, of an experiment their plans declare (see :func:`planned_keys`).
    """

    store: str
    hardware: str
    selection: Selection
    tasks: list[str]
    runs: list[RunRecord]
    pool: list[RunRecord]
    declared: TaskSet | None = None
    skipped: dict[str, str] = {}
    left_out: list[LeftOut] = []
    skipped_usage: Usage = Usage()
    solutions: dict[str, dict[str, dict[str, SolutionTiming]]] = {}
    usage: dict[str, Usage] = {}
    verdicts: list[Verdict] = []
    env: dict = {}
    incomplete_evaluations: dict[str, int] = {}
    incomplete_by_task: dict[str, dict[str, int]] = {}
    borrowed: dict[str, str] = {}
    incomplete_candidates: dict[str, list[str]] = {}
    held_back_copies: dict[str, list[int]] = {}

    def task_set(self) -> TaskSet:
        """The declared task set (``tasks`` for every group when none was recorded)."""
        return self.declared or TaskSet(default=list(self.tasks), source="the report's tasks")

    def solution_ms(self) -> dict[str, dict[str, dict[str, float]]]:
        """task -> solution -> workload -> mean latency (ms), workloads without one left out."""
        return {t: {s: {w: v.mean_ms for w, v in wls.items() if v.mean_ms is not None} for s, wls in sols.items()}
                for t, sols in self.solutions.items()}


#: Run statuses that are not (yet) a result: the run may still submit, or it died and is retried.
UNSETTLED = ("running", "interrupted")


def experiment(row) -> tuple:
    """The identity of a recorded run (docs/protocol.md, "Run identity and secrets"): task, model,
    backend, guidance, seed and budget (turns, and the wall clock its configuration records).
    Attempts recorded under an older run key, which held the endpoint and the backend options,
    have the same identity as those of the current key."""
    try:
        wall = json.loads(row["config_json"] or "{}").get("wall_clock_s")
    except (json.JSONDecodeError, AttributeError):
        wall = None
    return (row["task"], row["model"], row["backend"], row["guidance"], row["seed"], row["budget_turns"], wall)


def settled(rows) -> tuple[list, dict[str, str]]:
    """The runs that count, and run_id -> why each other one is left out.

    A run still ``running`` or ``interrupted`` is left out; of several attempts at one experiment
    (:func:`experiment`; attempts of a planned run share it whatever their run key) only the
    latest settled attempt counts: the highest attempt number, then the latest start.
    """
    latest: dict[tuple, Any] = {}  # a run row (sqlite3.Row or dict) per experiment
    skipped: dict[str, str] = {}
    for row in rows:
        if row["status"] in UNSETTLED:
            skipped[row["run_id"]] = row["status"]
            continue
        key = experiment(row)
        other = latest.get(key)
        order = (lambda r: (r["attempt"], r["started_at"], r["run_id"]))  # noqa: E731
        if other is not None and order(other) > order(row):
            row, other = other, row
        if other is not None:
            skipped[other["run_id"]] = f"attempt {other['attempt']}, superseded by {row['run_id']}"
        latest[key] = row
    return list(latest.values()), dict(sorted(skipped.items()))


def _run_record(row, cands: list[CandidateRecord], incomplete: Sequence[str] = ()) -> RunRecord:
    return RunRecord(run_id=row["run_id"], task=row["task"], model=row["model"], guidance=row["guidance"],
                     campaign=row["campaign"], backend=row["backend"], seed=row["seed"],
                     budget_turns=row["budget_turns"], status=row["status"], candidates=cands,
                     incomplete=list(incomplete))


def _solutions(store: Store, rows, hardware: str, hw: dict[str, str], states: dict[str, str]) -> dict:
    """task -> solution -> workload -> SolutionTiming, from the newest sha256 of each solution,
    complete evaluations only."""
    by_sol: dict[tuple[str, str], list] = defaultdict(list)
    for row in rows:
        if hw.get(row["eval_id"]) == hardware and states.get(row["eval_id"], "complete") == "complete":
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
            parsed = [timed_latency(store, r) for r in wrows]
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


def _plan_cells(plan: dict) -> tuple[list[str], list[str], list[str]]:
    """(tasks, models, guidance levels) a recorded plan declares."""
    design = plan.get("design", "paired")
    levels = list(plan.get("guidance") or []) if design == "custom" else list(DESIGNS.get(design, ()))
    models = [a["model"] for a in plan.get("agents", []) if isinstance(a, dict) and "model" in a]
    return list(plan.get("tasks", [])), models, levels


def declared_tasks(store: Store, sel: Selection, campaigns: list[str]) -> TaskSet:
    """The declared task set of a selection (docs/protocol.md, "Scores under missing data").

    ``--task`` declares its tasks for every group; otherwise the recorded plans of
    ``campaigns`` declare (model, guidance, task) cells and any other group is scored over
    the suite's tasks.
    """
    if sel.tasks:
        return TaskSet(default=sorted(set(sel.tasks)), source="the --task selection")

    groups = []
    for p in store.plans(campaigns) if campaigns else []:
        tasks, models, levels = _plan_cells(json.loads(p["plan_json"]))
        for m in models:
            for lv in levels:
                if (sel.models is None or m in sel.models) and (sel.guidance is None or lv in sel.guidance):
                    groups.append(DeclaredGroup(model=m, guidance=lv, tasks=tasks,
                                                source=f"campaign plan {p['name']!r}"))
    return TaskSet(default=list_tasks(), source="the suite", groups=groups)


def planned_keys(store: Store, campaigns: list[str]) -> set[str]:
    """The run keys (experiments, :meth:`d2kbench.agents.runner.RunSpec.key`) that the recorded
    plans of ``campaigns`` plan. A campaign's resume takes an experiment that any campaign has
    finished as done, so its scores must count that run wherever it is filed. A recorded plan
    this version cannot read plans nothing."""

    out: set[str] = set()
    for p in store.plans(campaigns):
        try:
            plan = Plan.model_validate(json.loads(p["plan_json"]))
        except (ValidationError, json.JSONDecodeError):
            continue
        out |= {spec.key() for spec in plan.runs()}
    return out


def _verdict(v) -> Verdict:
    sha = ""
    try:
        subject = json.loads(v["verdict_json"]).get("subject") or {}
        sha = subject.get("sha256") or ""
    except (json.JSONDecodeError, AttributeError):
        pass
    keys = v.keys()
    return Verdict(kind=v["kind"], task=v["task"], target=v["target"], judge_model=v["model"],
                   prompt_version=v["prompt_version"], rubric_version=v["rubric_version"],
                   status=v["status"] if "status" in keys else "judged", candidate_sha256=sha or "",
                   l1=v["l1"], l2=v["l2"], l3=v["l3"], js=v["js"])


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
            rows (see :mod:`d2kbench.scoring.stored`); a run whose candidates ran on different
            machines; a run whose recorded final candidate is not the scoring rule's.
    """
    sel = selection or Selection()
    envs = store.evaluation_envs()
    states = store.evaluation_states()
    hw = {eid: hardware_of(env) for eid, env in envs.items()}
    all_rows, borrowed = _selected_rows(store, sel)
    run_rows, skipped = settled(all_rows)
    pool_rows = _pool_rows(store, sel, baseline)
    by_id = {r["run_id"]: r for r in [*run_rows, *pool_rows]}
    stored = stored_candidates(store, list(by_id), hw, states)
    cands = stored.by_run
    # the plans of the selected campaigns, or of every campaign with runs here: a model or
    # guidance filter narrows the declared groups, it does not drop a plan
    campaigns = sel.campaigns or sorted({r["campaign"] for r in store.run_rows(seeds=sel.seeds) if r["campaign"]})
    declared = declared_tasks(store, sel, campaigns)
    keys = {(r["model"], r["guidance"]) for r in all_rows if r["guidance"] != DESIGN}
    keys |= {(g.model, g.guidance) for g in declared.groups}
    tasks = sorted({t for k in keys for t in declared.tasks_of(*k)[0]}) or list(sel.tasks or [])
    sol_rows = store.solution_rows(list(SOLUTION_BASELINES), tasks or None)
    seen = {h for cs in cands.values() for _, h in cs if h} | {hw[r["eval_id"]] for r in sol_rows if r["eval_id"] in hw}
    ev_task = store.evaluation_tasks()
    unfinished = {e for e, st in states.items() if st != "complete" and (not tasks or ev_task.get(e) in tasks)}
    hardware = _chosen_hardware(hardware, seen, unfinished, hw)
    if not tasks:  # no agent runs and no plan: the tasks whose solutions were timed here
        tasks = sorted({r["task"] for r in sol_rows if hw.get(r["eval_id"]) == hardware})
    elsewhere: dict[str, str] = {}
    runs = _run_records(run_rows, stored, hardware, elsewhere)
    skipped = dict(sorted({**skipped, **elsewhere}.items()))
    counted = {r.run_id for r in runs}
    usage, left_usage = _usage(store, counted, skipped)
    verdicts = [_verdict(v) for v in store.verdict_rows(tasks or None)]
    on_hw = [(envs[e].get("time_utc") or "", e) for e in envs if hw[e] == hardware and states.get(e) == "complete"]
    incomplete, by_task = _unfinished_counts(unfinished, hw, hardware, states, ev_task)
    copies = {rid: ids for rid in sorted(counted)
              if (ids := [c["id"] for c in store.candidates_of(rid) if c["status"] == HELD_BACK_COPY])}
    return ReportData(
        held_back_copies=copies,
        store=Path(store.path).name, hardware=hardware, selection=sel, tasks=tasks, declared=declared,
        runs=runs, skipped=skipped, left_out=_left_out(skipped, all_rows), skipped_usage=left_usage,
        pool=_run_records(pool_rows, stored, hardware), solutions=_solutions(store, sol_rows, hardware, hw, states),
        usage=usage, verdicts=verdicts,
        env=envs[max(on_hw)[1]] if on_hw else {}, incomplete_evaluations=incomplete, incomplete_by_task=by_task,
        borrowed={r: c for r, c in sorted(borrowed.items()) if r in counted},
        incomplete_candidates={r: v for r, v in stored.incomplete.items() if r in counted},
    )


def _selected_rows(store: Store, sel: Selection) -> tuple[list, dict[str, str]]:
    """The run rows of the selection, and ``{run_id: campaign}`` of the rows borrowed from other
    campaigns: with campaigns selected, a planned experiment another campaign ran (same run key)
    is done for these plans too."""
    all_rows = store.run_rows(sel.campaigns, sel.tasks, sel.models, sel.guidance, sel.seeds)
    borrowed: dict[str, str] = {}
    if sel.campaigns:  # a planned experiment another campaign ran is done for these plans too
        planned = planned_keys(store, sel.campaigns)
        have = {r["run_id"] for r in all_rows}
        extra = [r for r in store.run_rows(None, sel.tasks, sel.models, sel.guidance, sel.seeds)
                 if r["run_id"] not in have and r["run_key"] in planned]
        borrowed = {r["run_id"]: r["campaign"] or "no campaign" for r in extra}
        all_rows = [*all_rows, *extra]
    return all_rows, borrowed


def _pool_rows(store: Store, sel: Selection, baseline: BaselineSpec | None) -> list:
    """The settled run rows of a ``model:`` or ``run:`` baseline's pool (none for other baselines)."""
    pool_rows = []
    if baseline is not None and baseline.kind == "model":
        pool_rows = store.run_rows(sel.campaigns, sel.tasks, [baseline.name], [UNGUIDED], sel.seeds)
    elif baseline is not None and baseline.kind == "run":
        pool_rows = store.run_rows(run_ids=[baseline.name])
    return settled(pool_rows)[0]


def _chosen_hardware(hardware: str | None, seen: set[str], unfinished: set[str], hw: dict[str, str]) -> str:
    """The machine of the report: the one asked for (its GPU key when it names a GPU), else the
    only machine with results (``seen``), else the machine of the unfinished evaluations when
    nothing is complete, else ``"unknown"``.

    Raises:
        ScoringError: no machine asked for and results from several.
    """
    if hardware is None and not seen and len({hw.get(e) for e in unfinished}) == 1:
        seen = {hw[next(iter(unfinished))]}  # nothing complete: the machine of what was left out
    if hardware is None:
        if len(seen) > 1:
            raise ScoringError(f"the selection holds results from several machines ({', '.join(sorted(seen))}): "
                               "choose one (--hardware)")
        return next(iter(seen)) if seen else "unknown"
    return gpu_key(hardware) or hardware


def _run_records(rows, stored, hardware: str, where: dict[str, str] | None = None) -> list[RunRecord]:
    """The :class:`RunRecord` of each row whose candidates ran on ``hardware`` (or has none);
    the others are left out, with why in ``where`` when given.

    Raises:
        ScoringError: a run whose candidates ran on several machines, or whose recorded final
            candidate is not the scoring rule's.
    """
    cands = stored.by_run
    out = []
    for row in rows:
        machines = {h for _, h in cands.get(row["run_id"], []) if h}
        if len(machines) > 1:
            raise ScoringError(f"run {row['run_id']!r}: candidates evaluated on several machines "
                               f"({', '.join(sorted(machines))})")
        if machines and machines != {hardware}:
            if where is not None:
                where[row["run_id"]] = f"evaluated on {next(iter(machines))}"
            continue
        mine = [c for c, _ in cands.get(row["run_id"], [])]
        if row["guidance"] != DESIGN:
            check_recorded_final(row, mine)
        out.append(_run_record(row, mine, stored.incomplete.get(row["run_id"], [])))
    return out


def _left_out(skipped: dict[str, str], all_rows: list) -> list[LeftOut]:
    """The runs left out of the report, with why, in the order they started."""
    rows_by_id = {r["run_id"]: r for r in all_rows}
    left_out = [LeftOut(run_id=rid, task=rows_by_id[rid]["task"], model=rows_by_id[rid]["model"],
                        guidance=rows_by_id[rid]["guidance"], reason=why, superseded=why.startswith("attempt "))
                for rid, why in skipped.items()]
    left_out.sort(key=lambda x: (rows_by_id[x.run_id]["started_at"], x.run_id))
    return left_out


def _usage(store: Store, counted: set[str], skipped: dict[str, str]) -> tuple[dict[str, Usage], Usage]:
    """Token usage and cost per counted run, and the total of the runs left out."""
    usage: dict[str, Usage] = {}
    left_usage = Usage()
    for t in store.turn_rows(sorted(counted | set(skipped))):
        one = Usage(turns=1, input_tokens=t["input_tokens"], output_tokens=t["output_tokens"],
                    cache_read=t["cache_read"], cache_write=t["cache_write_5m"] + t["cache_write_1h"],
                    cost_usd=None if t["unpriced"] else t["cost_usd"],
                    unpriced_models=[t["model"] or "unknown model"] if t["unpriced"] else [])
        (usage.setdefault(t["run_id"], Usage(runs=1)) if t["run_id"] in counted else left_usage).add(one)
    return usage, left_usage


def _unfinished_counts(unfinished: set[str], hw: dict[str, str], hardware: str, states: dict[str, str],
                       ev_task: dict[str, str]) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """Unfinished evaluations on ``hardware`` counted by state, in all and per task."""
    incomplete: dict[str, int] = defaultdict(int)
    by_task: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for e in unfinished:  # of the selection's tasks, on this machine
        if hw.get(e) == hardware:
            incomplete[states[e]] += 1
            by_task[ev_task.get(e, "")][states[e]] += 1
    return dict(sorted(incomplete.items())), {k: dict(v) for k, v in sorted(by_task.items())}
