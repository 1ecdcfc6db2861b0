"""What the judge assesses: a run's final candidate, a solution file, or a design.

* :func:`impl_from_run`: a run id (or a unique prefix) from the store -> its final candidate,
  chosen by the scoring rule (:func:`d2kbench.scoring.selection.final_candidate`, the one
  Table 2 attributes the verdict to); a store that records another final candidate is an
  error. Target: the candidate's source SHA-256 (its content hash). A run without a correct
  candidate is judged *ineligible* (score 0, no model call); target: the run id.
* :func:`impl_from_solution`: a solution name of a task (``expert``, ``straightforward``) or a
  path. Eligibility comes from the store (the newest evaluation of the file's SHA-256), from
  the task itself (its own solutions must pass every check: ``d2k validate``), or from a fresh
  evaluation by the harness. Target: the file's SHA-256.
* :func:`design_from_run` / :func:`design_from_file`: a design run's accepted design, or a
  ``model_design.json`` file (which must pass the design schema). Target: the run id, or the
  design's SHA-256.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from d2kbench.judge.cache import canonical_json, sha256_text
from d2kbench.judge.design_schema import validate_design
from d2kbench.judge.sourcelines import SourceFile
from d2kbench.scoring.metrics import ScoringError
from d2kbench.scoring.stored import check_recorded_final, stored_candidates
from d2kbench.tasks import TaskFileError, load_task
from d2kbench.tasks.loader import Task

# Imports inside functions: the harness (and torch) load only when a candidate must be evaluated now.

#: The name the candidate file has in the judge's listing (citations use it).
CANDIDATE_NAME = "solution.py"
#: Ways to decide whether a solution file is correct (see :func:`impl_from_solution`).
CHECKS = ("auto", "store", "evaluate", "trust")


class TargetError(ValueError):
    """The thing to judge cannot be found or read; the message names the cause."""


@dataclass
class ImplSubject:
    """A candidate implementation to judge.

    Attributes:
        task: the loaded task.
        target: what the verdict is recorded for (run id or solution SHA-256).
        candidate: the source as the judge sees it (None when there is none to show).
        eligible: the candidate passed every check; an ineligible one scores 0 unjudged.
        reason: how eligibility was decided.
        meta: provenance (run id, candidate id, path, SHA-256, evaluation id...).
    """

    task: Task
    target: str
    candidate: SourceFile | None
    eligible: bool
    reason: str
    meta: dict = field(default_factory=dict)


@dataclass
class DesignSubject:
    """A design to judge (``design`` None: the run produced no accepted design; scores 0)."""

    task: Task
    target: str
    design: dict | None
    reason: str
    meta: dict = field(default_factory=dict)


def expert_source(task: Task) -> str:
    """The text of the task's expert solution.

    Raises:
        TargetError: the task has no ``solutions/expert.py``.
    """
    path = task.solutions().get("expert")
    if path is None or not path.is_file():
        raise TargetError(f"task {task.id!r} has no expert solution (solutions/expert.py): the implementation "
                          "judge compares against it")
    return path.read_text()


def find_run(store, ref: str):
    """The run row whose id is ``ref`` or starts with it.

    Raises:
        TargetError: no such run, or the prefix is ambiguous.
    """
    row = store.run(ref)
    if row is not None:
        return row
    rows = store.runs_with_prefix(ref)
    if len(rows) == 1:
        return rows[0]
    if not rows:
        raise TargetError(f"no run {ref!r} in the store {store.path}")
    raise TargetError(f"run prefix {ref!r} is ambiguous: {', '.join(r['run_id'] for r in rows[:5])}")


def _load_task(task_id: str) -> Task:
    try:
        return load_task(task_id)
    except TaskFileError as e:
        raise TargetError(f"cannot load task {task_id!r}: {e}") from None


def impl_from_run(store, ref: str) -> ImplSubject:
    """The final candidate of run ``ref`` (id or unique prefix), by the scoring rule.

    Raises:
        TargetError: unknown run, a design run, a run still running, a store whose recorded
            final candidate is not the one the scoring rule selects, or a final candidate
            whose snapshot is missing or no longer matches its recorded hash.
    """
    run = find_run(store, ref)
    run_id = run["run_id"]
    if run["guidance"] == "design":
        raise TargetError(f"run {run_id} is an independent design run: judge it with `d2k judge design {run_id}`")
    if run["status"] == "running":
        raise TargetError(f"run {run_id} is still running; judge it once it has finished")
    task = _load_task(run["task"])
    cands = store.candidates_of(run_id)
    meta = {"run_id": run_id, "guidance": run["guidance"], "agent_model": run["model"], "candidates": len(cands)}
    try:
        final = check_recorded_final(run, stored_candidates(store, [run_id]).records(run_id))
    except ScoringError as e:
        raise TargetError(str(e)) from None
    if final is None:
        why = ("the run has no candidates" if not cands
               else f"none of the run's {len(cands)} candidates is fully correct")
        return ImplSubject(task, run_id, None, False, why, meta)
    row = next(c for c in cands if c["id"] == final.id)
    path = Path(row["path"])
    if not path.is_file():
        raise TargetError(f"run {run_id}: the snapshot of final candidate {row['id']} is missing ({path})")
    text = path.read_text()
    if sha256_text(path.read_bytes()) != row["solution_sha256"]:
        raise TargetError(f"run {run_id}: snapshot {path} no longer matches the SHA-256 recorded at submission")
    meta.update({"candidate_id": row["id"], "path": str(path), "sha256": row["solution_sha256"],
                 "eval_id": row["eval_id"], "turn": row["turn"]})
    return ImplSubject(task, row["solution_sha256"], SourceFile(CANDIDATE_NAME, text), True,
                       f"final candidate {row['id']} of run {run_id} (eligible; the scoring rule's choice)", meta)


def _stored_eligibility(store, sha: str) -> tuple[bool, str] | None:
    rows = [r for r in store.rows(solution=sha) if r["solution_sha256"] == sha and r["role"] == "candidate"]
    if not rows:
        return None
    eval_id = rows[0]["eval_id"]  # newest first
    mine = [r for r in rows if r["eval_id"] == eval_id]
    bad = [f"{r['workload']}: {r['status']}" for r in mine if r["status"] != "ok"]
    if bad:
        return False, f"evaluation {eval_id} in the store: {'; '.join(bad[:3])}"
    return True, f"evaluation {eval_id} in the store: all {len(mine)} workloads passed"


def impl_from_solution(task: Task | str, solution: str, store=None, check: str = "auto", device: str = "auto",
                       progress=None) -> ImplSubject:
    """A solution of ``task`` (a name such as ``expert`` or a path) as an implementation subject.

    Args:
        task: a loaded task or a task id.
        solution: a solution name of the task or a file path.
        store: the results store (for ``store`` / ``auto`` checks and to record evaluations).
        check: how to decide correctness: ``store`` (the newest stored evaluation of the file's
            SHA-256), ``evaluate`` (run the harness now), ``trust`` (assume correct), or
            ``auto``: the store if it has an evaluation, else trust the task's own
            ``solutions/`` files, else evaluate.
        device: for ``evaluate``: ``auto``, ``cuda`` or ``cpu`` (smoke workloads).
        progress: called with short messages while evaluating.

    Raises:
        TargetError: unknown solution or check, or ``store`` without a stored evaluation.
    """
    task = _load_task(task) if isinstance(task, str) else task
    if check not in CHECKS:
        raise TargetError(f"unknown check {check!r} (one of: {', '.join(CHECKS)})")
    try:
        path = task.resolve_solution(solution)
    except FileNotFoundError as e:
        raise TargetError(str(e)) from None
    data = path.read_bytes()
    sha = sha256_text(data)
    meta = {"solution": solution, "path": str(path), "sha256": sha}
    decided: tuple[bool, str] | None = None
    if check in ("store", "auto") and store is not None:
        decided = _stored_eligibility(store, sha)
    if decided is None and check == "store":
        raise TargetError(f"no evaluation of {path} (sha256 {sha[:12]}) in the store: run `d2k eval {task.id} {path}` "
                          "first, or pass --check evaluate")
    own = path.parent == task.root / "solutions"
    if decided is None and (check == "trust" or (check == "auto" and own)):
        decided = (True, "task solution: passes every check by the task contract (d2k validate)" if own
                   else "assumed correct (--check trust)")
    if decided is None:
        from d2kbench.harness.evaluate import Options, evaluate

        ev = evaluate(task, path, None, device, None, store=store, options=Options(),
                      progress=progress)
        failed = [f"{r.workload}: {r.status.value}" for r in ev.candidate.results if r.status.value != "ok"]
        decided = (ev.candidate.eligible, f"evaluated now ({ev.id}, {ev.device}): "
                   + ("all workloads passed" if not failed else "; ".join(failed[:3])))
        meta["eval_id"] = ev.id
    eligible, reason = decided
    return ImplSubject(task, sha, SourceFile(CANDIDATE_NAME, data.decode(errors="replace")), eligible, reason, meta)


def design_sha256(design: dict) -> str:
    """The identity of a design: SHA-256 of its canonical JSON."""
    return sha256_text(canonical_json(design))


def design_from_run(store, ref: str) -> DesignSubject:
    """The accepted design of independent design run ``ref`` (id or unique prefix).

    Raises:
        TargetError: unknown run, not a design run, or still running.
    """
    run = find_run(store, ref)
    run_id = run["run_id"]
    if run["guidance"] != "design":
        raise TargetError(f"run {run_id} is not a design run (guidance {run['guidance']!r}): judge its code with "
                          f"`d2k judge impl {run_id}`")
    if run["status"] == "running":
        raise TargetError(f"run {run_id} is still running; judge it once it has finished")
    task = _load_task(run["task"])
    summary = json.loads(run["summary_json"] or "{}")
    design = summary.get("design")
    meta = {"run_id": run_id, "agent_model": run["model"]}
    if not design:
        return DesignSubject(task, run_id, None, f"the design run ended ({run['exit_reason']}) without an accepted "
                                                 "design", meta)
    meta["design_sha256"] = design_sha256(design)
    return DesignSubject(task, run_id, design, "accepted design of the run", meta)


def design_from_file(task: Task | str, path: str | Path) -> DesignSubject:
    """A ``model_design.json`` file of ``task``.

    Raises:
        TargetError: missing file, or a design that fails the schema (every problem named).
    """
    task = _load_task(task) if isinstance(task, str) else task
    p = Path(path)
    if not p.is_file():
        raise TargetError(f"design file {p} not found")
    design, problems = validate_design(p.read_text(), task.id)
    if design is None:
        raise TargetError(f"{p} is not a valid model_design.json:\n" + "\n".join(f"  {x}" for x in problems))
    data = json.loads(p.read_text())
    return DesignSubject(task, design_sha256(data), data, f"design file {p}", {"path": str(p.resolve()),
                                                                                "design_sha256": design_sha256(data)})
