"""Plain-data records of an evaluation (pydantic), shared by harness, store, scores and reports.

Statistics are kept at full precision; rounding happens only when a report prints them.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, Field

from d2kbench.phases import harness_seconds


class Status(str, Enum):
    """Outcome of one solution on one workload, most severe first."""

    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    OOM = "oom"
    INTEGRITY_VIOLATION = "integrity_violation"
    INCORRECT = "incorrect"
    NOT_RUN = "not_run"  # skipped after the solution timed out or its worker died on an earlier workload
    OK = "ok"

    @property
    def failed(self) -> bool:
        return self is not Status.OK


class CheckResult(BaseModel):
    """One numerical/structural check of one call.

    ``error`` is the measured value in the tolerance's unit (relative Frobenius error, fraction
    of mismatching elements, ...); ``threshold`` the largest accepted value.
    """

    call: int
    name: str
    against: str = ""
    metric: str = ""
    passed: bool
    error: float | None = None
    threshold: float | None = None
    detail: str = ""


class Violation(BaseModel):
    """A broken integrity rule and the evidence for it."""

    rule: str
    evidence: str


class TimingStats(BaseModel):
    """Per-call latency statistics in milliseconds, computed from ``samples_ms``.

    ``samples_ms`` holds every per-call sample (events mode: one call each; graph mode: one
    replay divided by the calls it holds; cpu mode: one host-timed call).
    """

    mode: str
    samples_ms: list[float]
    n: int
    mean_ms: float
    median_ms: float
    std_ms: float
    p10_ms: float
    p90_ms: float
    min_ms: float
    max_ms: float
    ci95_low_ms: float
    ci95_high_ms: float
    calls_per_sample: int = 1
    input_sets: int = 1
    warmup_calls: int = 0
    l2_flush: bool = False
    hold_us: float | None = None    # events mode: per-sample GPU spin (us) in force at the end (timing.PRIME_US)
    late_starts: int | None = None  # events mode: samples whose start event fired before the call was queued
    #: GPU: one call after the timing loop (d2kbench.harness.memory): the peak allocation above the
    #: pre-call level, and the bytes of the returned tensors (peak - outputs = the call's workspace)
    peak_mem_bytes: int | None = None
    output_mem_bytes: int | None = None


class WorkloadResult(BaseModel):
    """The result of one solution on one workload: status, checks, timing."""

    workload: str
    status: Status
    cause: str = ""
    checks: list[CheckResult] = []
    violations: list[Violation] = []
    #: checks of the integrity protocol's extra calls (d2kbench.integrity.parent): the
    #: sensitivity call, outputs kept from timed calls, CUDA-graph verification replays
    integrity_checks: list[CheckResult] = []
    timing: TimingStats | None = None
    correctness_only: bool = False
    wall_s: float = 0.0

    def worst_check(self) -> CheckResult | None:
        """The check with the largest error relative to its threshold (for the summary table)."""
        scored = [c for c in self.checks if c.error is not None and c.threshold]
        if not scored:
            return None
        return max(scored, key=lambda c: c.error / c.threshold)  # type: ignore[operator]


class SolutionRun(BaseModel):
    """One solution evaluated on a list of workloads."""

    solution: str
    path: str
    sha256: str
    role: str  # "candidate" or "baseline"
    results: list[WorkloadResult] = []
    #: the first worker's start-up (seconds: process start, torch import, CUDA init, task and
    #: guard set-up, solution import), as the worker reported it (diagnostics only)
    startup_s: dict[str, float] = {}

    def result(self, workload: str) -> WorkloadResult | None:
        for r in self.results:
            if r.workload == workload:
                return r
        return None

    @property
    def eligible(self) -> bool:
        """Every workload passed every check."""
        return bool(self.results) and all(r.status is Status.OK for r in self.results)


class WorkloadScore(BaseModel):
    """Speedup and roofline figures of the candidate on one timed workload."""

    workload: str
    latency_ms: float | None
    baseline_ms: float | None
    speedup: float | None
    sol_ms: float | None
    sol_floor_ms: float | None
    pct_sol: float | None
    below_floor: bool = False


class Evaluation(BaseModel):
    """``evaluate()``'s answer: candidate and baseline runs, per-workload scores, geomean."""

    id: str
    task: str
    device: str
    created_at: str
    candidate: SolutionRun
    baseline: SolutionRun | None = None
    scores: list[WorkloadScore] = []
    geomean_speedup: float | None = None
    env: dict = Field(default_factory=dict)
    wall_s: float = 0.0
    timed_s: float = 0.0
    #: exclusive wall seconds per harness phase (d2kbench.phases), summing to wall_s
    phases_s: dict[str, float] = Field(default_factory=dict)

    @property
    def overhead_s(self) -> float:
        """Wall time beyond the timed calls' own time."""
        return self.wall_s - self.timed_s

    @property
    def harness_s(self) -> float:
        """Wall time outside the solutions' own calls (:func:`d2kbench.phases.harness_seconds`)."""
        return harness_seconds(self.wall_s, self.phases_s)
