"""``benchmark()``: several solutions of one task timed in one run, interleaved per workload,
with speedups against a baseline and between every pair, and achieved rates.

This is the measurement behind performance bars ("the expert is at least 1.8x the reference on
each workload"): all solutions see the same inputs, alternate per workload, and are checked
exactly as in :func:`d2kbench.harness.evaluate.evaluate`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel

from d2kbench.harness.env import fingerprint, nvidia_smi
from d2kbench.harness.evaluate import (
    Options,
    default_workloads,
    phase_breakdown,
    recorded_evaluation,
    resolve_device,
    run_solutions,
    timed_seconds,
)
from d2kbench.harness.launch_floor import launch_floor_ms
from d2kbench.phases import PhaseClock, phase
from d2kbench.results import SolutionRun
from d2kbench.scoring.sol import MEASURED, bound_of, gpu_key, sol_ms
from d2kbench.scoring.speedup import geomean
from d2kbench.tasks.formula import evaluate_formula
from d2kbench.tasks.loader import Task
from d2kbench.tasks.schema import Workload


class Rate(BaseModel):
    """Achieved rate of one solution on one workload from its work model's counts.

    ``tflops`` = tensor-core FLOPs / mean latency (TFLOP/s); ``tbps`` = minimal bytes / mean
    latency (TB/s); ``pct_*`` against the measured ceilings of the GPU (None on the CPU).
    ``bound`` is what limits the workload (:func:`d2kbench.scoring.sol.bound_of`);
    ``pct_sol`` = 100 x the SOL time of the task's floor work model on the measured ceilings /
    mean latency (the minimal bytes or FLOPs at the ceiling rate); ``x_launch_floor`` = mean
    latency / the measured launch floor of the workload's timing mode.
    """

    workload: str
    work_model: str
    mean_ms: float
    tflops: float
    tbps: float
    pct_bf16_ceiling: float | None
    pct_hbm_ceiling: float | None
    bound: str | None = None
    pct_sol: float | None = None
    x_launch_floor: float | None = None


class BenchmarkResult(BaseModel):
    id: str
    task: str
    device: str
    created_at: str
    baseline: str
    runs: list[SolutionRun]
    rates: dict[str, list[Rate]]
    env: dict
    wall_s: float
    timed_s: float
    launch_floor_ms: dict[str, float] = {}  # per timing mode, measured in this run (GPU only)
    phases_s: dict[str, float] = {}  # exclusive wall seconds per harness phase (d2kbench.phases)

    def run(self, solution: str) -> SolutionRun:
        return next(r for r in self.runs if r.solution == solution)

    def speedup(self, solution: str, over: str, workload: str) -> float | None:
        """Mean latency of ``over`` / mean latency of ``solution`` on ``workload`` (both ok)."""
        a, b = self.run(solution).result(workload), self.run(over).result(workload)
        if a and b and a.timing and b.timing and not a.status.failed and not b.status.failed:
            return b.timing.mean_ms / a.timing.mean_ms
        return None

    def geomean_speedup(self, solution: str, over: str) -> float | None:
        timed = [r.workload for r in self.run(solution).results if not r.correctness_only]
        vals = [self.speedup(solution, over, w) for w in timed]
        return geomean(vals) if vals and all(v is not None for v in vals) else None  # type: ignore[arg-type]


def rates_of(task: Task, solution: str, run: SolutionRun, workloads: list[Workload], env: dict,
             launch_floors: dict[str, float] | None = None) -> list[Rate]:
    """Achieved TFLOP/s and TB/s of one solution, counting the work of the model the task file
    assigns to it (``sol.solution_work``; paths and unknown names count the reference's work),
    plus the workload's bound, % of SOL and the multiple of the launch floor
    (``launch_floors``: ms per timing mode, from :func:`d2kbench.harness.launch_floor.launch_floor_ms`)."""
    name, counts = task.spec.sol.work_of(solution)
    floor_counts = task.spec.sol.counts(task.spec.sol.floor)
    ceil = MEASURED.get(gpu_key(env.get("gpu")) or "")
    floors = launch_floors or {}
    out = []
    for wl in workloads:
        r = run.result(wl.id)
        if wl.correctness_only or r is None or r.timing is None or r.status.failed:
            continue
        sec = r.timing.mean_ms / 1e3
        tflops = evaluate_formula(counts.tc_flops, wl.axes) / sec / 1e12
        tbps = evaluate_formula(counts.bytes, wl.axes) / sec / 1e12
        floor = floors.get(r.timing.mode)
        sol = sol_ms(floor_counts, wl.axes, ceil) if ceil else None  # (ms, binding limit)
        out.append(Rate(workload=wl.id, work_model=name, mean_ms=r.timing.mean_ms, tflops=tflops, tbps=tbps,
                        pct_bf16_ceiling=100 * tflops / ceil.bf16_tflops if ceil else None,
                        pct_hbm_ceiling=100 * tbps / ceil.hbm_tbps if ceil else None,
                        bound=bound_of(task.spec, wl, ceil, floor, sol) if sol and ceil else wl.bound,
                        pct_sol=100 * sol[0] / r.timing.mean_ms if sol else None,
                        x_launch_floor=r.timing.mean_ms / floor if floor else None))
    return out


def measure_launch_floors(modes: set[str]) -> dict[str, float]:
    """The launch floor (ms) of each GPU timing mode in ``modes`` (``cpu`` has none)."""
    return {m: launch_floor_ms(m) for m in sorted(modes) if m in ("graph", "events")}


def benchmark(task: Task, solutions: list[str], workloads: list[Workload] | None = None, device: str = "auto",
              baseline: str = "reference", *, store=None, options: Options | None = None,
              progress: Callable[[str], None] | None = None) -> BenchmarkResult:
    """Check and time ``solutions`` and ``baseline`` side by side on ``workloads``.

    Raises:
        FileNotFoundError: an unknown solution; ValueError: a duplicate name or a bad device.
    """
    names = [*solutions, baseline]
    if len(set(names)) != len(names):
        raise ValueError(f"each solution may appear once (got {names})")
    opts = options or Options()
    device = resolve_device(device)
    workloads = workloads if workloads is not None else default_workloads(task, device)
    t0 = time.perf_counter()
    clock = PhaseClock()
    with clock.active():
        with phase("environment"):
            env = fingerprint(device)
        bid = uuid.uuid4().hex[:12]
        created = datetime.now(timezone.utc).isoformat(timespec="seconds")
        entries: list[tuple[str, str, str | Path]] = [(s, "candidate", s) for s in solutions]
        entries.append((baseline, "baseline", baseline))
        with recorded_evaluation(store, bid, task, device, env, created):
            runs = run_solutions(task, entries, workloads, device, opts, env, bid, created, store, progress)
        floors = {}
        if device == "cuda":
            with phase("environment"):
                env["smi_after"] = nvidia_smi()
            with phase("launch_floor"):
                floors = measure_launch_floors({task.spec.timing_for(w).mode for w in workloads})
    wall = time.perf_counter() - t0
    return BenchmarkResult(
        id=bid, task=task.id, device=device, created_at=created, baseline=baseline, runs=list(runs.values()),
        rates={s: rates_of(task, s, runs[s], workloads, env, floors) for s in names}, env=env,
        wall_s=wall, timed_s=timed_seconds(runs.values()), launch_floor_ms=floors, phases_s=phase_breakdown(clock, wall),
    )
