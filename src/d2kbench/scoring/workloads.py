"""Per-workload scores of one evaluation: speedup against the baseline, % of SOL, geomean."""

from __future__ import annotations

from d2kbench.results import SolutionRun, WorkloadScore
from d2kbench.scoring.sol import MEASURED, gpu_key, sol_ms
from d2kbench.scoring.speedup import geomean, speedup
from d2kbench.tasks.loader import Task
from d2kbench.tasks.schema import Workload


def score_workloads(task: Task, workloads: list[Workload], candidate: SolutionRun,
                    baseline: SolutionRun | None, env: dict) -> tuple[list[WorkloadScore], float | None]:
    """Scores of the timed workloads and the task geomean speedup.

    The geomean is over timed workloads and only when the candidate passed every workload
    and every timed workload has a baseline time; otherwise it is None (a failed task).
    SOL uses the measured ceilings of the GPU in ``env`` (None on the CPU or an unknown GPU);
    ``below_floor`` flags a latency under the floor variant's SOL time.
    """
    ceil = MEASURED.get(gpu_key(env.get("gpu")) or "")
    sol = task.spec.sol
    scores = []
    for wl in workloads:
        if wl.correctness_only:
            continue
        cand = candidate.result(wl.id)
        base = baseline.result(wl.id) if baseline else None
        lat = cand.timing.mean_ms if cand and cand.status.value == "ok" and cand.timing else None
        blat = base.timing.mean_ms if base and base.status.value == "ok" and base.timing else None
        ref_sol = floor_sol = None
        if ceil is not None:
            ref_sol, _ = sol_ms(sol.reference, wl.axes, ceil)
            floor_sol, _ = sol_ms(sol.counts(sol.floor), wl.axes, ceil)
        scores.append(WorkloadScore(
            workload=wl.id, latency_ms=lat, baseline_ms=blat,
            speedup=speedup(blat, lat) if lat and blat else None,
            sol_ms=ref_sol, sol_floor_ms=floor_sol,
            pct_sol=100.0 * floor_sol / lat if lat and floor_sol else None,
            below_floor=bool(lat and floor_sol and lat < floor_sol),
        ))
    speedups = [s.speedup for s in scores]
    geo = None
    if candidate.eligible and speedups and all(v is not None for v in speedups):
        geo = geomean(speedups)  # type: ignore[arg-type]
    return scores, geo
