"""``evaluate()``: one solution (and a baseline) on a task's workloads, checked and timed.

Data flow per workload: the parent draws secret seeds and generates inputs, computes the
expected values itself (reference / FP64 oracle: :mod:`d2kbench.checking.expected`), sends the
inputs to the solution's sandboxed worker, checks what comes back
(:mod:`d2kbench.checking.verdict`), asks the worker to time, and re-checks once more after timing
(:mod:`d2kbench.harness.workload`). Candidate and baseline alternate per workload (interleaved),
each in its own worker.

Failures end fast: a solution that does not compile gets ``compile_error`` on every workload
before any worker starts; one that times out or whose worker dies is not run on its remaining
workloads (``not_run``, unless ``keep_going``); the baseline is timed only where the candidate
passed; request timeouts follow the workload (:mod:`d2kbench.harness.deadlines`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from d2kbench.checking.expected import Prefetch, prefetch_budget
from d2kbench.checking.verdict import WorkerFailure, status_value
from d2kbench.harness.deadlines import Deadlines
from d2kbench.harness.env import fingerprint, nvidia_smi
from d2kbench.harness.process import WorkerHandle
from d2kbench.harness.workload import run_workload
from d2kbench.integrity.parent import make_guards
from d2kbench.integrity.static import syntax_problem
from d2kbench.phases import PhaseClock, phase
from d2kbench.results import Evaluation, SolutionRun, Status, Violation, WorkloadResult
from d2kbench.scoring.workloads import score_workloads
from d2kbench.tasks.loader import Task
from d2kbench.tasks.schema import Workload

#: Correctness calls before timing (each with fresh inputs at fresh addresses); one more follows timing.
N_CHECK_CALLS = 3


@dataclass
class Options:
    """Knobs of one evaluation (defaults: ``docs/integrity.md`` and ``docs/timing.md``)."""

    check_calls: int = N_CHECK_CALLS
    timeout_s: float | None = None        # per request; default: scaled to the workload (harness/deadlines.py)
    time_solutions: bool = True
    cpu_samples: int = 3
    timing_params: dict = field(default_factory=dict)  # passed to the GPU timer
    integrity: bool = True      # d2kbench.integrity (monitors, extra calls, AST rules); off: correctness-only tests
    static_checks: bool = True  # the AST rules (off: show that a run-time defence catches a cheat on its own)
    sensitivity: bool = True    # the extra call on inputs with one secretly changed element
    keep_going: bool = False    # run the remaining workloads after a timeout or a dead worker


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu``.

    Raises:
        ValueError: unknown device, or ``cuda`` without a GPU.
    """
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {device!r} (auto, cuda or cpu)")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda but no GPU is visible")
    return device


def default_workloads(task: Task, device: str) -> list[Workload]:
    """Registered workloads on the GPU, smoke workloads on the CPU; never a distributed workload
    (``ranks`` > 1), which this single-process harness does not run (:func:`skipped_by_default`)."""
    return [w for w in (task.spec.workloads if device == "cuda" else task.spec.smoke_workloads) if w.ranks == 1]


def skipped_by_default(task: Task, device: str) -> list[str]:
    """``"<workload>: <reason>"`` for each registered workload that :func:`default_workloads`
    leaves out on ``device`` (the distributed ones, on the GPU), for the command line to say so."""
    if device != "cuda":
        return []
    return [f"{w.id}: {why.removeprefix('not run: ')}" for w in task.spec.workloads if (why := unrunnable(w, device))]


def unrunnable(wl: Workload, device: str) -> str | None:
    """Why the single-process harness does not run ``wl`` on ``device`` (None: it does).

    A distributed workload (``ranks`` > 1) needs one GPU per rank and a runner that starts the
    ranks; this harness runs one process on one device, so it reports such a workload
    ``not_run`` with the reason instead of failing it.
    """
    if wl.ranks <= 1:
        return None
    have = torch.cuda.device_count() if device == "cuda" else 0
    if have < wl.ranks:
        return f"not run: needs {wl.ranks} GPUs (a distributed workload of {wl.ranks} ranks); this machine has {have}"
    return (f"not run: a distributed workload of {wl.ranks} ranks runs under a multi-GPU runner, "
            "not the single-process harness")


#: Failures after which a solution is not run on its remaining workloads (the worker hung or died).
STOPPING = (Status.TIMEOUT,)


def _stops(result: WorkloadResult) -> bool:
    return result.status in STOPPING or (result.status is Status.RUNTIME_ERROR and "worker died" in result.cause)


class _Solutions:
    """The workers of one :func:`run_solutions`, and which of them still run."""

    def __init__(self, task: Task, paths: dict[str, Path], device: str, opts: Options):
        self.handles = {label: WorkerHandle(task.root, p, device, opts.timeout_s or task.spec.timeout_s,
                                            {"trusted": task.is_trusted(p), "integrity": opts.integrity})
                        for label, p in paths.items()}
        self.deadlines = {label: Deadlines(device, task.spec.timeout_s, opts.timeout_s) for label in paths}

    def restart(self, label: str) -> None:
        """A fresh worker after a failed workload (the old one's state may be anything), booked
        as start-up.

        Raises:
            WorkerFailure: the new worker does not start.
        """
        h = self.handles[label]
        if h.proc is None:
            with phase("worker_start"):
                h.spawn()
                h.wait_ready(self.deadlines[label].start())


def run_solutions(task: Task, entries: list[tuple[str, str, str | Path]], workloads: list[Workload], device: str,
                  opts: Options, env: dict, ev_id: str, created: str, store=None,
                  progress: Callable[[str], None] | None = None,
                  timed_for: dict[str, str] | None = None) -> dict[str, SolutionRun]:
    """Run several solutions side by side: one worker each, interleaved per workload (the order
    alternates between workloads), sharing every call's inputs and expected values.

    Args:
        entries: ``(label, role, solution)``: a unique label, the role stored with each record
            (``candidate`` or ``baseline``), and a solution name or path.
        timed_for: label -> label: solutions that only serve another (a baseline for its
            candidate): not run when that one does not compile or stops, and timed only on the
            workloads it passed.

    Returns:
        ``{label: SolutionRun}``; every workload result is also recorded in ``store`` at once.
    """
    say = progress or (lambda _msg: None)
    paths = {label: task.resolve_solution(sol, device) for label, _, sol in entries}
    # d2kbench.integrity: static rules, extra calls, and file hashes taken before any solution runs
    guards = make_guards(task, paths, device, static=opts.static_checks, sensitivity=opts.sensitivity) \
        if opts.integrity else {}
    runs = {label: SolutionRun(solution=str(sol), path=str(paths[label]), sha256=task.solution_sha256(paths[label]),
                               role=role)
            for label, role, sol in entries}
    book = _Book(runs, workloads, timed_for or {}, store, (ev_id, task.id, device, env, created))
    bad = {label: why for label, p in paths.items() if not task.is_trusted(p) and (why := syntax_problem(p))}
    for label, why in bad.items():  # reported before any worker starts
        book.give_up(label, Status.COMPILE_ERROR, f"does not compile: {why}")
    sols = _Solutions(task, {k: v for k, v in paths.items() if book.done(k) < len(workloads)}, device, opts)
    if not sols.handles:
        return runs
    try:
        reference, prefetch = _start_workers(task, sols, book, workloads, device, opts, say)
        for n, wl in enumerate(workloads):
            _run_workload_step(n, wl, task, reference, sols, book, prefetch, guards, device, opts, say)
    finally:
        for h in sols.handles.values():
            h.close()
    return runs


class _Book:
    """The solution runs of one evaluation as they grow: each workload result is appended and
    stored at once (:meth:`record`); a solution that stops fails its remaining workloads with one
    cause, and so do the solutions that only serve it (:meth:`give_up`)."""

    def __init__(self, runs: dict[str, SolutionRun], workloads: list[Workload], timed_for: dict[str, str], store,
                 where: tuple[str, str, str, dict, str]):
        self.runs = runs
        self.workloads = workloads
        self.timed_for = timed_for
        self.store = store
        self.where = where  # (evaluation id, task id, device, env, created): the store's keys

    def done(self, label: str) -> int:
        """How many workloads of ``label`` have a result."""
        return len(self.runs[label].results)

    def record(self, label: str, result: WorkloadResult) -> None:
        self.runs[label].results.append(result)
        if self.store is not None:
            ev_id, task_id, device, env, created = self.where
            self.store.record(ev_id, task_id, self.runs[label], result, device, env, created)

    def give_up(self, label: str, status: Status, cause: str, violations: list | None = None) -> None:
        """Every remaining workload of ``label`` fails with one cause; its dependents are not run."""
        for wl in self.workloads[self.done(label):]:
            self.record(label, WorkloadResult(workload=wl.id, status=status, cause=cause, violations=violations or [],
                                              correctness_only=wl.correctness_only))
        for dep, of in self.timed_for.items():
            if of == label and dep in self.runs and self.done(dep) < len(self.workloads):
                self.give_up(dep, Status.NOT_RUN, f"not run: {label} does not run")


def _start_workers(task: Task, sols: _Solutions, book: _Book, workloads: list[Workload], device: str, opts: Options,
                   say: Callable[[str], None]):
    """Spawn every worker, prepare the first calls' inputs and expected values while they start,
    and wait until each is ready (a solution whose import fails gives up every workload).
    Returns ``(reference module, Prefetch)``."""
    say("starting workers")
    with phase("worker_start"):
        for h in sols.handles.values():  # spawn all workers first: their start-up overlaps
            h.spawn()
    with phase("prepare"):  # while the workers import torch and the solutions
        reference = task.reference_module()
        prefetch = Prefetch(task, reference, workloads, device, opts.check_calls, prefetch_budget(device))
    while not all(h.answered() for h in sols.handles.values()) and prefetch.step():
        pass  # the first calls' inputs and expected values, while the workers start
    for label, h in sols.handles.items():
        try:
            with phase("worker_start"):
                h.wait_ready(sols.deadlines[label].start())
            book.runs[label].startup_s = h.startup_s
        except WorkerFailure as f:  # import failed: every workload gets the same cause and findings
            book.give_up(label, status_value(f.status), f.cause, [Violation(**x) for x in f.violations])
    return reference, prefetch


def _run_workload_step(n: int, wl: Workload, task: Task, reference, sols: _Solutions, book: _Book, prefetch: Prefetch,
                       guards: dict, device: str, opts: Options, say: Callable[[str], None]) -> None:
    """Workload ``n`` for every solution still running (the order alternates between workloads):
    fresh workers where needed, the workload's protocol, the results recorded; a solution that
    failed gets a fresh worker next time, one that stops gives up (unless ``keep_going``)."""
    running = [x for x in sols.handles if book.done(x) == n]
    skip = unrunnable(wl, device)
    if skip is not None:
        for label in running:
            book.record(label, WorkloadResult(workload=wl.id, status=Status.NOT_RUN, cause=skip,
                                              correctness_only=wl.correctness_only))
        say(f"{wl.id}: {skip}")
        return
    for label in running:
        try:
            sols.restart(label)
        except WorkerFailure as f:
            book.give_up(label, status_value(f.status), f"worker restart failed: {f.cause}")
    running = [x for x in running if book.done(x) == n]
    if not running:
        return
    order = running if n % 2 == 0 else list(reversed(running))
    say(f"{wl.id}: {' vs '.join(book.runs[r].solution for r in order)}")
    try:
        results = run_workload({r: sols.handles[r] for r in order}, task, reference, wl, device, opts, guards,
                               prefetch, sols.deadlines, {d: of for d, of in book.timed_for.items() if of in order})
    except Exception as e:  # noqa: BLE001 - the trusted side failed: judge nobody, go on with the next workload
        _harness_failed(wl, order, sols, book, device, e, say)
        return
    with phase("store"):
        for label in order:
            book.record(label, results[label])
            if results[label].status.failed:
                sols.handles[label].kill()  # a fresh worker for the next workload
    for label in order:
        if _stops(results[label]) and not opts.keep_going:
            book.give_up(label, Status.NOT_RUN, f"not run: {results[label].status.value} on {wl.id} "
                                                f"({results[label].cause[:120]}); --keep-going runs every workload")
    if device == "cuda":  # this workload's inputs and expected values: back to the driver
        torch.cuda.empty_cache()


def _harness_failed(wl: Workload, order: list[str], sols: _Solutions, book: _Book, device: str, error: Exception,
                    say: Callable[[str], None]) -> None:
    """The parent failed on ``wl`` before it could judge (its reference, expected values or checks
    raised: a CUDA out-of-memory on a workload too large for the machine, a bug in a task's
    reference): every solution of the step gets ``not_run`` with that cause (the failure is not
    theirs), their workers are replaced, and the evaluation goes on with the next workload
    instead of losing the results already recorded."""
    cause = f"not run: the harness failed on {wl.id} before judging: {type(error).__name__}: {str(error)[:300]}"
    say(cause)
    for label in order:
        book.record(label, WorkloadResult(workload=wl.id, status=Status.NOT_RUN, cause=cause,
                                          correctness_only=wl.correctness_only))
        sols.handles[label].kill()  # its state may hold this workload's inputs
    if device == "cuda":
        torch.cuda.empty_cache()


def phase_breakdown(clock: PhaseClock, wall_s: float) -> dict[str, float]:
    """The clock's exclusive seconds per phase plus ``unaccounted`` (wall minus their sum)."""
    out = clock.snapshot()
    out["unaccounted"] = wall_s - sum(out.values())
    return out


def timed_seconds(runs) -> float:
    """Seconds spent inside timed calls (samples x calls per sample) across runs."""
    return sum(r.timing.mean_ms * r.timing.n * r.timing.calls_per_sample / 1e3
               for run in runs for r in run.results if r.timing)


@contextmanager
def recorded_evaluation(store, ev_id: str, task: Task, device: str, env: dict, created: str) -> Iterator[None]:
    """An evaluation's status in ``store`` (None: no store) around the block that runs it:
    ``running`` on entry, ``complete`` when the block ends, ``interrupted`` when it raises
    (an error, Ctrl-C, or SIGTERM from a timeout wrapper: the CLI turns it into an exception).
    Reports use complete evaluations only (docs/protocol.md). The exception is re-raised."""
    if store is None:
        yield
        return
    store.start_evaluation(ev_id, task.id, device, env, created)
    try:
        yield
    except BaseException:
        store.finish_evaluation(ev_id, "interrupted")
        raise
    store.finish_evaluation(ev_id)


def evaluate(task: Task, solution: str | Path, workloads: list[Workload] | None = None, device: str = "auto",
             baseline: str | Path | None = "reference", *, store=None, options: Options | None = None,
             progress: Callable[[str], None] | None = None) -> Evaluation:
    """Evaluate ``solution`` (a name of the task's solutions or a path) on ``workloads``.

    Args:
        task: a loaded task.
        solution: ``straightforward``, ``expert``, ``reference`` or a path to a ``.py`` file.
        workloads: default: registered workloads on cuda, smoke workloads on cpu.
        device: ``auto``, ``cuda`` or ``cpu`` (cpu runs Triton under the interpreter).
        baseline: a solution name or path to time against (interleaved per workload), or None.
        store: a :class:`d2kbench.store.Store`; every workload result is recorded as it finishes.
        options: :class:`Options`.
        progress: called with a short message before each step.

    Returns:
        An :class:`Evaluation` with per-workload results, speedups and the geomean.

    Raises:
        FileNotFoundError: unknown solution; ValueError: bad device. Solution failures never raise.
    """
    opts = options or Options()
    device = resolve_device(device)
    workloads = workloads if workloads is not None else default_workloads(task, device)
    t_start = time.perf_counter()
    clock = PhaseClock()
    with clock.active():
        with phase("environment"):
            env = fingerprint(device)
        entries = [("candidate", "candidate", solution)] + ([("baseline", "baseline", baseline)] if baseline is not None else [])
        ev_id = uuid.uuid4().hex[:12]
        created = datetime.now(timezone.utc).isoformat(timespec="seconds")
        with recorded_evaluation(store, ev_id, task, device, env, created):
            runs = run_solutions(task, entries, workloads, device, opts, env, ev_id, created, store, progress,
                                 timed_for={"baseline": "candidate"})
        if device == "cuda":
            with phase("environment"):
                env["smi_after"] = nvidia_smi()
        scores, geo = score_workloads(task, workloads, runs["candidate"], runs.get("baseline"), env)
    wall = time.perf_counter() - t_start
    return Evaluation(id=ev_id, task=task.id, device=device, created_at=created, candidate=runs["candidate"],
                      baseline=runs.get("baseline"), scores=scores, geomean_speedup=geo, env=env,
                      wall_s=wall, timed_s=timed_seconds(runs.values()), phases_s=phase_breakdown(clock, wall))
