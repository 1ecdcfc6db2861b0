"""``evaluate()``: one solution (and a baseline) on a task's workloads, checked and timed.

Data flow per workload: the parent draws secret seeds and generates inputs, computes the
expected values itself (reference / FP64 oracle), sends the inputs to the solution's worker,
checks what comes back, asks the worker to time, and re-checks once more after timing.
Candidate and baseline alternate per workload (interleaved), each in its own worker.
"""

from __future__ import annotations

import inspect
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch

from d2kbench.harness import checks
from d2kbench.harness.env import fingerprint, nvidia_smi
from d2kbench.harness.inputs import args_nbytes, clone_args, make_args, secret_seed
from d2kbench.harness.phases import PhaseClock, phase
from d2kbench.harness.phases import current as current_clock
from d2kbench.harness.process import WorkerFailure, WorkerHandle
from d2kbench.integrity.parent import make_guards
from d2kbench.harness.results import (
    CheckResult, Evaluation, SolutionRun, Status, TimingStats, Violation, WorkloadResult,
)
from d2kbench.scoring.workloads import score_workloads
from d2kbench.tasks.loader import Task
from d2kbench.tasks.schema import TensorArg, Workload

#: Correctness calls before timing (each with fresh inputs at fresh addresses); one more follows timing.
N_CHECK_CALLS = 3


@dataclass
class Options:
    """Knobs of one evaluation (defaults follow DESIGN.md)."""

    check_calls: int = N_CHECK_CALLS
    timeout_s: float | None = None        # per request; default: the task's timeout_s
    time_solutions: bool = True
    cpu_samples: int = 3
    timing_params: dict = field(default_factory=dict)  # passed to the GPU timer
    integrity: bool = True      # d2kbench.integrity (monitors, extra calls, AST rules); off: correctness-only tests
    static_checks: bool = True  # the AST rules (off: show that a run-time defence catches a cheat on its own)
    sensitivity: bool = True    # the extra call on inputs with one secretly changed element


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
    """Registered workloads on the GPU, smoke workloads on the CPU."""
    return list(task.spec.workloads if device == "cuda" else task.spec.smoke_workloads)


def _as_list(result) -> list:
    return list(result) if isinstance(result, (tuple, list)) else [result]


class _Expected:
    """Expected values of one call, computed lazily once and shared by every solution checked
    on this call's inputs: the reference's outputs and argument states, and FP64-oracle outputs
    on secretly sampled slices.

    ``oracle_cap`` limits the slices sampled per tolerance (the integrity protocol's extra calls
    use 1: they look for outputs that stopped following the inputs, which the full-tensor
    reference comparison and one FP64 slice show; the tolerance's own count applies to the
    correctness calls)."""

    def __init__(self, task: Task, reference, workload: Workload, pristine: list, oracle_cap: int | None = None):
        self.spec = task.spec
        self.ref = reference
        self.wl = workload
        self.pristine = pristine
        self.oracle_cap = oracle_cap
        self._reference: tuple[list, list] | None = None
        self._oracle: dict = {}

    def reference(self) -> tuple[list, list]:
        """(reference outputs, argument states after the reference ran), on a private copy."""
        if self._reference is None:
            with phase("reference"), torch.no_grad():
                ref_args = clone_args(self.pristine)
                self._reference = (_as_list(self.ref.run(*ref_args)), ref_args)
                _settle(ref_args)
        return self._reference

    def oracle(self, tol) -> tuple[tuple[str, torch.Tensor] | None, list]:
        """(sample, oracle outputs on the sampled slices) for a tolerance's sampling rule."""
        key = (tol.sample.axis, tol.sample.count) if tol.sample else None
        if key not in self._oracle:
            fn = getattr(self.ref, "oracle", None)
            if fn is None:
                raise ValueError(f"task {self.spec.id!r} asks for an oracle but reference.py defines none")
            sample, args = None, self.pristine
            if tol.sample:
                size = self.wl.axes[tol.sample.axis]
                count = min(tol.sample.count, self.oracle_cap or tol.sample.count)
                gen = torch.Generator().manual_seed(secret_seed())
                sample = (tol.sample.axis, torch.randperm(size, generator=gen)[:count].sort().values)
                args = [_take(a, spec, *sample) for a, spec in zip(args, self.spec.args)]
            with phase("oracle"), torch.no_grad():
                self._oracle[key] = (sample, _as_list(fn(*clone_args(args))))
                _settle(args)
        return self._oracle[key]

    def precompute(self) -> None:
        """Compute now everything the checks of this call will ask for: the reference's outputs
        and states, and the FP64-oracle slices of every ``against: oracle`` tolerance."""
        self.reference()
        for ospec in self.spec.outputs:
            for tol in self.wl.checks_for(ospec.name, ospec.checks):
                if tol.against == "oracle":
                    self.oracle(tol)

    def nbytes(self) -> int:
        """Bytes held: the inputs plus the expected values computed so far."""
        held = list(self.pristine)
        if self._reference is not None:
            held += self._reference[0] + self._reference[1]
        for _sample, outs in self._oracle.values():
            held += outs
        return args_nbytes(held)


def _draw_call(task: Task, reference, workload: Workload, device: str) -> tuple[list, _Expected]:
    """Fresh secret inputs for one correctness call and their (lazy) expected values."""
    with phase("inputs"):
        pristine = make_args(reference, task.spec, workload, secret_seed(), device)
        _settle(pristine)
    return pristine, _Expected(task, reference, workload, pristine)


class Prefetch:
    """Correctness calls drawn and checked-against ahead of time, while the workers start.

    Spawned workers spend seconds importing torch, initialising CUDA and importing (and
    guarding) the solution, during which the parent and the GPU are idle. :meth:`step` draws the
    next correctness call's secret inputs and computes its expected values (reference, FP64
    oracle) in that time; :func:`run_workload` takes them instead of drawing new ones. The
    inputs stay secret in the parent until their call; each solution still gets its own copy
    at a fresh address. What is prefetched is bounded by ``budget_bytes`` of inputs plus
    expected values.
    """

    def __init__(self, task: Task, reference, workloads: list[Workload], device: str, calls: int,
                 budget_bytes: int):
        self.task, self.reference, self.device = task, reference, device
        self.plan = [wl for wl in workloads for _ in range(calls)]
        self.ready: dict[str, list[tuple[list, _Expected]]] = {}
        self.budget_bytes = budget_bytes
        self.held_bytes = 0
        self.done = not self.plan

    def step(self) -> bool:
        """Prepare the next planned call; False when there is nothing (more) to do: the plan is
        finished, the budget is spent, or preparing failed (the same failure then surfaces
        where the call is drawn normally)."""
        if self.done:
            return False
        wl = self.plan.pop(0)
        try:
            pristine, expected = _draw_call(self.task, self.reference, wl, self.device)
            expected.precompute()
        except Exception:  # noqa: BLE001 - e.g. OOM: stop prefetching, the normal path reports
            self.done = True
            return False
        self.ready.setdefault(wl.id, []).append((pristine, expected))
        self.held_bytes += expected.nbytes()
        self.done = not self.plan or self.held_bytes >= self.budget_bytes
        return True

    def take(self, workload: Workload) -> tuple[list, _Expected] | None:
        """The oldest prepared call of ``workload`` (removed), or None."""
        queue = self.ready.get(workload.id)
        if not queue:
            return None
        item = queue.pop(0)
        self.held_bytes -= item[1].nbytes()
        return item


def prefetch_budget(device: str) -> int:
    """Bytes the parent may hold in prefetched calls: a quarter of the GPU memory free at the
    start (the workers need the rest), 1 GiB on the CPU."""
    if device == "cuda":
        free, _total = torch.cuda.mem_get_info()
        return free // 4
    return 1 << 30


def _settle(args: list) -> None:
    """Wait for the GPU work queued so far when ``args`` live on a GPU, so that the phase
    clock charges asynchronous kernels to the phase that queued them (the parent would wait
    for them at its next check anyway)."""
    if any(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
        torch.cuda.synchronize()


def _take(value, spec, axis: str, idx: torch.Tensor):
    if isinstance(spec, TensorArg) and axis in spec.shape:
        return value.index_select(spec.shape.index(axis), idx.to(value.device))
    return value


def check_reply(call: int, spec, wl: Workload, reference, args: list, expected: _Expected,
                reply: dict) -> tuple[list[CheckResult], list[Violation]]:
    """All checks of one call: structure, finiteness, tolerances, state updates, untouched inputs,
    plus the integrity evidence the worker reported (aliases, tensor subclasses)."""
    results, violations = [], []
    outs = [o.clone() if o is not None else None for o in reply["outputs"]]
    if not spec.outputs and reply.get("container") == "NoneType":
        outs = []  # an in-place operator (no declared outputs) may return None as well as ()
    for evidence in reply.get("aliases", []):
        violations.append(Violation(rule="no_aliasing", evidence=evidence))
    for k, (sub, tname) in enumerate(zip(reply["subclass"], reply["types"])):
        if sub:
            violations.append(Violation(rule="exact_tensor_type", evidence=f"output {k} is a {tname}, not torch.Tensor"))
    if len(outs) != len(spec.outputs):
        results.append(CheckResult(call=call, name="outputs:count", passed=False,
                                   detail=f"returned {len(outs)} outputs ({reply.get('container')}), expected {len(spec.outputs)}"))
        return results, violations
    ref_outs, ref_state = expected.reference()

    def apply(name, shape, tol, out, ref_value, out_index) -> CheckResult:
        exp = ref_value
        if tol.against == "oracle":
            if out_index is None:
                raise ValueError("oracle checks apply to outputs only")
            sample, oracle_outs = expected.oracle(tol)
            exp = oracle_outs[out_index]
            if sample is not None:
                out = out.index_select(shape.index(sample[0]), sample[1].to(out.device))
        custom = None
        if tol.metric == "custom":
            fn = getattr(reference, "check", None)
            named = fn is not None and "output" in inspect.signature(fn).parameters  # per-output property checks
            custom = (lambda: fn(expected.pristine, outs, **({"output": name} if named else {}))) if fn else None
        return checks.compare(call, name, tol, out, exp, shape.index, custom)

    for k, (ospec, out) in enumerate(zip(spec.outputs, outs)):
        if out is None:
            results.append(CheckResult(call=call, name=f"{ospec.name}:structure", passed=False,
                                       detail=f"{ospec.name} is {reply['types'][k]}, expected torch.Tensor"))
            continue
        st = checks.structure(call, ospec, out, wl, (reply.get("strides") or [None] * len(outs))[k])
        results.append(st)
        if not st.passed:
            continue
        results.append(checks.finite(call, ospec.name, out))
        for tol in wl.checks_for(ospec.name, ospec.checks):
            results.append(apply(ospec.name, ospec.shape, tol, out, ref_outs[k], k))
    for i, (aspec, now) in enumerate(zip(spec.args, args)):
        if not isinstance(aspec, TensorArg):
            continue
        if aspec.mutable:
            for tol in wl.checks_for(aspec.name, spec.state_checks[aspec.name]):
                results.append(apply(f"state:{aspec.name}", aspec.shape, tol, now, ref_state[i], None))
        else:
            results.append(checks.untouched(call, aspec.name, now, expected.pristine[i]))
    return results, violations


def _status_of(checks_: list[CheckResult], violations: list[Violation]) -> tuple[Status, str]:
    if violations:
        return Status.INTEGRITY_VIOLATION, f"{violations[0].rule}: {violations[0].evidence}"
    failed = [c for c in checks_ if not c.passed]
    if failed:
        c = failed[0]
        err = f" error {c.error:.3e} > {c.threshold:.3e}" if c.error is not None and c.threshold is not None else ""
        return Status.INCORRECT, f"call {c.call}: {c.name}{err} {c.detail}".strip()
    return Status.OK, ""


@dataclass
class _RoleState:
    checks: list = field(default_factory=list)
    violations: list = field(default_factory=list)
    timing: TimingStats | None = None
    failure: tuple[Status, str] | None = None
    integrity_checks: list = field(default_factory=list)


def run_workload(handles: dict[str, WorkerHandle], task: Task, reference, workload: Workload, device: str,
                 opts: Options, guards: dict | None = None,
                 prefetch: Prefetch | None = None) -> dict[str, WorkloadResult]:
    """Check (``opts.check_calls`` calls), time, and re-check every solution in ``handles`` on one
    workload. Each call's inputs and expected values are drawn and computed once and shared by
    the solutions (each gets its own copy of the inputs); the order of ``handles`` is the order
    in which the solutions run (alternate it between workloads to interleave).

    ``guards`` (label -> :class:`d2kbench.integrity.parent.ParentGuard`) add the integrity
    protocol: worker findings, static findings, the sensitivity call, checks of timed outputs.
    ``prefetch`` supplies correctness calls prepared while the workers started (the re-check
    after timing always draws its inputs then).

    Never raises for solution failures: they come back as each result's status and cause.
    """
    t0 = time.perf_counter()
    st = {role: _RoleState() for role in handles}
    guards = guards or {}

    def active() -> list[str]:
        return [r for r in handles if st[r].failure is None]

    def one_call(call: int) -> None:
        ready = prefetch.take(workload) if prefetch is not None and call < opts.check_calls else None
        pristine, expected = ready or _draw_call(task, reference, workload, device)
        for role in active():
            try:
                with phase("inputs"):
                    args = clone_args(pristine)
                with phase("worker_calls"):
                    reply = handles[role].request({"op": "call", "args": args})
                _split_worker_phases(reply, "worker_calls", "worker")
            except WorkerFailure as f:
                st[role].failure = (_status(f.status), f.cause)
                st[role].violations.extend(Violation(**x) for x in f.violations)
                continue
            with phase("checks"):
                c, v = check_reply(call, task.spec, workload, reference, args, expected, reply)
                if role in guards:
                    v += guards[role].on_reply(call, reply, pristine, last=call == opts.check_calls - 1,
                                               expected=expected)
            st[role].checks.extend(c)
            st[role].violations.extend(v)
            status, cause = _status_of(st[role].checks, st[role].violations)
            if status is not Status.OK:
                st[role].failure = (status, cause)

    for call in range(opts.check_calls):
        one_call(call)
    for role in [r for r in active() if r in guards]:  # integrity: one input element changed must move the output
        try:
            with phase("integrity_sensitivity"):
                failed, allc, v = guards[role].sensitivity(
                    lambda a, h=handles[role]: h.request({"op": "call", "args": a}), reference, workload)
        except WorkerFailure as f:
            st[role].failure = (_status(f.status), f.cause)
            st[role].violations.extend(Violation(**x) for x in f.violations)
            continue
        st[role].checks.extend(failed)
        st[role].integrity_checks.extend(allc)
        st[role].violations.extend(v)
        if failed or v:
            st[role].failure = _status_of(st[role].checks, st[role].violations)
    if opts.time_solutions and not workload.correctness_only and active():
        mode = "cpu" if device == "cpu" else task.spec.timing_for(workload).mode
        for role in active():
            seeds = [secret_seed() for _ in range(256 if mode == "graph" else 2)]
            extra = guards[role].time_request_extra() if role in guards else {}
            if device == "cuda":  # the parent's cached blocks (reference, oracle) back to the driver: the
                torch.cuda.empty_cache()  # worker's timing loop needs the memory (measured: an OOM without)
            try:
                with phase("timing_request"):
                    reply = handles[role].request({"op": "time", "workload": workload.id, "seeds": seeds, "mode": mode,
                                                   "cpu_samples": opts.cpu_samples, "params": opts.timing_params, **extra})
                _split_worker_phases(reply, "timing_request", "timing")
                st[role].timing = TimingStats.model_validate(reply["stats"])
                if role in guards:  # worker findings, outputs kept from timed calls, graph replays, SOL floor
                    with phase("integrity_after_timing"):
                        c, v = guards[role].after_timing(reply, reference, workload, seeds, extra)
                    st[role].integrity_checks.extend(c)
                    st[role].violations.extend(v)
                    if v:
                        st[role].failure = _status_of(st[role].checks, st[role].violations)
            except WorkerFailure as f:
                st[role].failure = (_status(f.status), f.cause)
                st[role].violations.extend(Violation(**x) for x in f.violations)
        one_call(opts.check_calls)  # re-check after the timing loop
    for role in [r for r in guards if r in st]:  # integrity: harness and task files unchanged
        with phase("integrity_file_hashes"):
            v = guards[role].after_workload()
        st[role].violations.extend(v)
        if v and st[role].failure is None:
            st[role].failure = _status_of(st[role].checks, st[role].violations)
    wall = time.perf_counter() - t0
    return {role: WorkloadResult(workload=workload.id, status=s.failure[0] if s.failure else Status.OK,
                                 cause=s.failure[1] if s.failure else "", checks=s.checks, violations=s.violations,
                                 integrity_checks=s.integrity_checks,
                                 timing=s.timing, correctness_only=workload.correctness_only, wall_s=wall)
            for role, s in st.items()}


def _split_worker_phases(reply: dict, source: str, prefix: str) -> None:
    """Move the worker's own breakdown of a request (``reply["phases"]``, seconds; a call:
    ``unpack`` (unpickling the args), ``run``, ``guard``, ``pack``; a timing request: ``inputs``,
    ``warmup`` (warm-up calls, L2 flushes, graph capture), ``samples``, ``integrity``) out of the
    parent's ``source`` phase into ``<prefix>_<part>`` phases; what stays in ``source`` is the
    pipe and the worker's pickling of its answer (the parent's own pickling and unpickling are
    the ``transfer_send`` / ``transfer_recv`` phases).
    The worker's figures are diagnostics only: no check reads them."""
    clock, parts = current_clock(), reply.get("phases")
    if clock is not None and isinstance(parts, dict):
        clock.move(source, {f"{prefix}_{k}": v for k, v in parts.items()})


def _status(value: str) -> Status:
    return Status(value) if value in Status._value2member_map_ else Status.RUNTIME_ERROR


def _new_handle(task: Task, path: Path, device: str, opts: Options, trusted: bool) -> WorkerHandle:
    return WorkerHandle(task.root, path, device, opts.timeout_s or task.spec.timeout_s,
                        {"trusted": trusted, "integrity": opts.integrity})


def run_solutions(task: Task, entries: list[tuple[str, str, str | Path]], workloads: list[Workload], device: str,
                  opts: Options, env: dict, ev_id: str, created: str, store=None,
                  progress: Callable[[str], None] | None = None) -> dict[str, SolutionRun]:
    """Run several solutions side by side: one worker each, interleaved per workload (the order
    alternates between workloads), sharing every call's inputs and expected values.

    Args:
        entries: ``(label, role, solution)``: a unique label, the role stored with each record
            (``candidate`` or ``baseline``), and a solution name or path.

    Returns:
        ``{label: SolutionRun}``; every workload result is also recorded in ``store`` at once.
    """
    say = progress or (lambda _msg: None)
    paths = {label: task.resolve_solution(sol, device) for label, _, sol in entries}
    # d2kbench.integrity: static rules, extra calls, and file hashes taken before any solution runs
    guards = make_guards(task, paths, device, opts)
    runs = {label: SolutionRun(solution=str(sol), path=str(paths[label]), sha256=task.solution_sha256(paths[label]),
                               role=role)
            for label, role, sol in entries}
    handles = {label: _new_handle(task, paths[label], device, opts, trusted=task.is_trusted(paths[label]))
               for label in runs}

    def record(label: str, result: WorkloadResult) -> None:
        runs[label].results.append(result)
        if store is not None:
            store.record(ev_id, task.id, runs[label], result, device, env, created)

    try:
        say("starting workers")
        with phase("worker_start"):
            for h in handles.values():  # spawn all workers first: their start-up overlaps
                h.spawn()
        with phase("prepare"):  # while the workers import torch and the solutions
            reference = task.reference_module()
            prefetch = Prefetch(task, reference, workloads, device, opts.check_calls, prefetch_budget(device))
        while not all(h.answered() for h in handles.values()) and prefetch.step():
            pass  # the first calls' inputs and expected values, while the workers start
        live = {}
        for label, h in handles.items():
            try:
                with phase("worker_start"):
                    h.wait_ready()
                runs[label].startup_s = h.startup_s
                live[label] = h
            except WorkerFailure as f:  # import failed: every workload gets the same cause and findings
                for wl in workloads:
                    record(label, WorkloadResult(workload=wl.id, status=_status(f.status), cause=f.cause,
                                                 violations=[Violation(**x) for x in f.violations],
                                                 correctness_only=wl.correctness_only))
        for n, wl in enumerate(workloads):
            order = list(live) if n % 2 == 0 else list(reversed(live))
            say(f"{wl.id}: {' vs '.join(runs[r].solution for r in order)}")
            results = run_workload({r: live[r] for r in order}, task, reference, wl, device, opts, guards, prefetch)
            with phase("store"):
                for label in live:
                    if results[label].status.failed:
                        live[label].kill()  # a fresh worker for the next workload
                    record(label, results[label])
            if device == "cuda":  # this workload's inputs and expected values: back to the driver
                torch.cuda.empty_cache()
    finally:
        for h in handles.values():
            h.close()
    return runs


def phase_breakdown(clock: PhaseClock, wall_s: float) -> dict[str, float]:
    """The clock's exclusive seconds per phase plus ``unaccounted`` (wall minus their sum)."""
    out = clock.snapshot()
    out["unaccounted"] = wall_s - sum(out.values())
    return out


def timed_seconds(runs) -> float:
    """Seconds spent inside timed calls (samples x calls per sample) across runs."""
    return sum(r.timing.mean_ms * r.timing.n * r.timing.calls_per_sample / 1e3
               for run in runs for r in run.results if r.timing)


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
        runs = run_solutions(task, entries, workloads, device, opts, env, ev_id, created, store, progress)
        if device == "cuda":
            with phase("environment"):
                env["smi_after"] = nvidia_smi()
        scores, geo = score_workloads(task, workloads, runs["candidate"], runs.get("baseline"), env)
    wall = time.perf_counter() - t_start
    return Evaluation(id=ev_id, task=task.id, device=device, created_at=created, candidate=runs["candidate"],
                      baseline=runs.get("baseline"), scores=scores, geomean_speedup=geo, env=env,
                      wall_s=wall, timed_s=timed_seconds(runs.values()), phases_s=phase_breakdown(clock, wall))
