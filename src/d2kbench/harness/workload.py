"""One workload for several solutions side by side: correctness calls, the integrity protocol's
extra calls, timing, the re-check after timing (:func:`run_workload`).

Each call's inputs and expected values are drawn and computed once, in the parent, and shared
by the solutions (each gets its own copy of the inputs). The steps of :class:`WorkloadRun`
follow the protocol of ``docs/integrity.md`` ("The integrity protocol of one workload").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from d2kbench.checking.expected import Expected, Prefetch, draw_call
from d2kbench.checking.inputs import clone_args, secret_seed
from d2kbench.checking.verdict import WorkerFailure, check_reply, status_of, status_value
from d2kbench.harness.deadlines import Deadlines
from d2kbench.harness.process import WorkerHandle
from d2kbench.phases import current as current_clock
from d2kbench.phases import phase
from d2kbench.results import Status, TimingStats, Violation, WorkloadResult
from d2kbench.tasks.loader import Task
from d2kbench.tasks.schema import Workload


@dataclass
class RoleState:
    """What one solution got on the workload so far."""

    checks: list = field(default_factory=list)
    violations: list = field(default_factory=list)
    timing: TimingStats | None = None
    failure: tuple[Status, str] | None = None
    integrity_checks: list = field(default_factory=list)
    slowest_call_s: float = 0.0  # the parent's round trip of the slowest correctness call
    untimed: str = ""  # why the solution was not timed on this workload

    def fail(self, f: WorkerFailure) -> None:
        self.failure = (status_value(f.status), f.cause)
        self.violations.extend(Violation(**x) for x in f.violations)

    def settle(self) -> None:
        """Take the status that the checks and violations so far give."""
        status, cause = status_of(self.checks, self.violations)
        if status is not Status.OK:
            self.failure = (status, cause)


def split_worker_phases(reply: dict, source: str, prefix: str) -> None:
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


class WorkloadRun:
    """The protocol of one workload for the solutions in ``handles`` (label -> worker), run in
    that order (alternate it between workloads to interleave).

    Args:
        guards: label -> :class:`d2kbench.integrity.parent.ParentGuard` (the integrity protocol:
            worker findings, static findings, the sensitivity call, checks of timed outputs).
        prefetch: correctness calls prepared while the workers started.
        deadlines: label -> request timeouts.
        timed_for: label -> the label it is timed for (a baseline is timed only where the
            candidate it is compared with passed its correctness calls).
    """

    def __init__(self, handles: dict[str, WorkerHandle], task: Task, reference, workload: Workload, device: str,
                 opts, guards: dict | None = None, prefetch: Prefetch | None = None,
                 deadlines: dict[str, Deadlines] | None = None, timed_for: dict[str, str] | None = None):
        self.handles, self.task, self.reference, self.wl, self.device = handles, task, reference, workload, device
        self.opts = opts
        self.guards = guards or {}
        self.prefetch = prefetch
        self.deadlines = deadlines or {}
        self.timed_for = timed_for or {}
        self.st = {role: RoleState() for role in handles}
        self.reference_s: float | None = None

    def active(self) -> list[str]:
        return [r for r in self.handles if self.st[r].failure is None]

    def _call_timeout(self, role: str) -> float | None:
        d = self.deadlines.get(role)
        return d.call(self.reference_s) if d is not None else None

    def correctness_call(self, call: int) -> None:
        """One call on fresh secret inputs for every active solution, checked in full."""
        ready = self.prefetch.take(self.wl) if self.prefetch is not None and call < self.opts.check_calls else None
        pristine, expected = ready or draw_call(self.task, self.reference, self.wl, self.device)
        expected.reference()  # before the first request: its time sets the request's timeout
        self.reference_s = max(self.reference_s or 0.0, expected.reference_s or 0.0)
        for role in self.active():
            self._one(role, call, pristine, expected)

    def _one(self, role: str, call: int, pristine: list, expected: Expected) -> None:
        s = self.st[role]
        try:
            with phase("inputs"):
                args = clone_args(pristine)
            t0 = time.perf_counter()
            with phase("worker_calls"):
                reply = self.handles[role].request({"op": "call", "args": args}, timeout_s=self._call_timeout(role))
            s.slowest_call_s = max(s.slowest_call_s, time.perf_counter() - t0)
            split_worker_phases(reply, "worker_calls", "worker")
        except WorkerFailure as f:
            s.fail(f)
            self._name_static_rules(role, s)
            return
        with phase("checks"):
            c, v = check_reply(call, self.task.spec, self.wl, self.reference, args, expected, reply)
            if role in self.guards:
                v += self.guards[role].on_reply(call, reply, pristine, last=call == self.opts.check_calls - 1,
                                                expected=expected)
        s.checks.extend(c)
        s.violations.extend(v)
        s.settle()

    def _name_static_rules(self, role: str, s: RoleState) -> None:
        """A worker that died took the call's report with it: name what the static review found
        (an ``os._exit`` is ``ast_process_control``) in the cause and keep the findings."""
        guard = self.guards.get(role)
        if guard is None or not guard.static or s.failure is None or "worker died" not in s.failure[1]:
            return
        found = "; ".join(f"{v.rule}: {v.evidence}" for v in guard.static[:3])
        s.failure = (s.failure[0], f"{s.failure[1]}; the static review found {found}")
        s.violations.extend(v for v in guard.static if v not in s.violations)

    def sensitivity(self) -> None:
        """The integrity protocol's extra call: one input element changed must move the output."""
        for role in [r for r in self.active() if r in self.guards]:
            s = self.st[role]
            h, timeout = self.handles[role], self._call_timeout(role)
            try:
                with phase("integrity_sensitivity"):
                    failed, allc, v = self.guards[role].sensitivity(
                        lambda a, h=h, t=timeout: h.request({"op": "call", "args": a}, timeout_s=t),
                        self.reference, self.wl)
            except WorkerFailure as f:
                s.fail(f)
                continue
            s.checks.extend(failed)
            s.integrity_checks.extend(allc)
            s.violations.extend(v)
            if failed or v:
                s.settle()

    def timing(self) -> None:
        """Time every active solution (a baseline only where its candidate passed)."""
        mode = "cpu" if self.device == "cpu" else self.task.spec.timing_for(self.wl).mode
        for role in self.active():
            of = self.timed_for.get(role)
            if of is not None and of in self.st and self.st[of].failure is not None:
                self.st[role].untimed = f"not timed: {of} failed its checks on this workload"
                continue
            self._time(role, mode)

    def _time(self, role: str, mode: str) -> None:
        s = self.st[role]
        seeds = [secret_seed() for _ in range(256 if mode == "graph" else 2)]
        extra = self.guards[role].time_request_extra() if role in self.guards else {}
        if self.device == "cuda":  # the parent's cached blocks (reference, oracle) back to the driver: the
            torch.cuda.empty_cache()  # worker's timing loop needs the memory (measured: an OOM without)
        d = self.deadlines.get(role)
        try:
            with phase("timing_request"):
                reply = self.handles[role].request(
                    {"op": "time", "workload": self.wl.id, "seeds": seeds, "mode": mode,
                     "cpu_samples": self.opts.cpu_samples, "params": self.opts.timing_params, **extra},
                    timeout_s=d.timing(max(s.slowest_call_s, self.reference_s or 0.0)) if d is not None else None)
            split_worker_phases(reply, "timing_request", "timing")
            s.timing = TimingStats.model_validate(reply["stats"])
            if role in self.guards:  # worker findings, outputs kept from timed calls, graph replays, SOL floor
                with phase("integrity_after_timing"):
                    c, v = self.guards[role].after_timing(reply, self.reference, self.wl, seeds, extra)
                s.integrity_checks.extend(c)
                s.violations.extend(v)
                if v:
                    s.settle()
        except WorkerFailure as f:
            s.fail(f)

    def file_hashes(self) -> None:
        """Integrity: the harness and task files are unchanged."""
        for role in [r for r in self.guards if r in self.st]:
            with phase("integrity_file_hashes"):
                v = self.guards[role].after_workload()
            self.st[role].violations.extend(v)
            if v and self.st[role].failure is None:
                self.st[role].settle()

    def results(self, wall_s: float) -> dict[str, WorkloadResult]:
        return {role: WorkloadResult(workload=self.wl.id, status=s.failure[0] if s.failure else Status.OK,
                                     cause=s.failure[1] if s.failure else s.untimed, checks=s.checks,
                                     violations=s.violations, integrity_checks=s.integrity_checks, timing=s.timing,
                                     correctness_only=self.wl.correctness_only, wall_s=wall_s)
                for role, s in self.st.items()}


def run_workload(handles: dict[str, WorkerHandle], task: Task, reference, workload: Workload, device: str,
                 opts, guards: dict | None = None, prefetch: Prefetch | None = None,
                 deadlines: dict[str, Deadlines] | None = None,
                 timed_for: dict[str, str] | None = None) -> dict[str, WorkloadResult]:
    """Check (``opts.check_calls`` calls), time, and re-check every solution in ``handles`` on one
    workload (see :class:`WorkloadRun` for the arguments).

    Never raises for solution failures: they come back as each result's status and cause.
    """
    t0 = time.perf_counter()
    run = WorkloadRun(handles, task, reference, workload, device, opts, guards, prefetch, deadlines, timed_for)
    for call in range(opts.check_calls):
        run.correctness_call(call)
    run.sensitivity()
    if opts.time_solutions and not workload.correctness_only and run.active():
        run.timing()
        run.correctness_call(opts.check_calls)  # re-check after the timing loop
    run.file_hashes()
    return run.results(time.perf_counter() - t0)
