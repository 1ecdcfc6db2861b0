"""Tables of one or more evaluations (rows as plain dicts, markdown), used by ``d2k eval``."""

from __future__ import annotations

from d2kbench.phases import SOLUTION_PHASES, harness_seconds
from d2kbench.results import Evaluation
from d2kbench.scoring.speedup import geomean

COLUMNS = ("workload", "status", "error / tol", "latency ms", "baseline ms", "speedup", "% SOL", "cause")


def fmt_opt(v: float | None, spec: str) -> str:
    """``v`` formatted with ``spec``, or "-" where there is no value (no GPU ceiling, a failed run)."""
    return "-" if v is None else format(v, spec)


def rows(ev: Evaluation) -> list[dict[str, str]]:
    """One row per workload of the candidate: status, worst error against its tolerance,
    mean latency, baseline mean latency, speedup, % of the SOL floor, cause."""
    scores = {s.workload: s for s in ev.scores}
    out = []
    for r in ev.candidate.results:
        worst = r.worst_check()
        s = scores.get(r.workload)
        err = f"{worst.error:.2e} / {worst.threshold:.1e}" if worst else "-"
        lat = r.timing.mean_ms if r.timing else None
        base = ev.baseline.result(r.workload) if ev.baseline else None
        blat = base.timing.mean_ms if base and base.timing else None
        cause = r.cause
        if base is not None and base.status.failed:
            cause = (cause + "; " if cause else "") + f"baseline {base.status.value}: {base.cause}"
        out.append({
            "workload": r.workload + (" (correctness)" if r.correctness_only else ""),
            "status": r.status.value,
            "error / tol": err,
            "latency ms": fmt_opt(lat, ".4f"),
            "baseline ms": fmt_opt(blat, ".4f"),
            "speedup": fmt_opt(s.speedup if s else None, ".3f"),
            "% SOL": fmt_opt(s.pct_sol if s else None, ".1f") + (" (below floor!)" if s and s.below_floor else ""),
            "cause": cause[:160],
        })
    return out


def summary(ev: Evaluation) -> str:
    """One line: geomean speedup against the baseline (or why there is none)."""
    base = ev.baseline.solution if ev.baseline else "none"
    if ev.geomean_speedup is not None:
        return f"{ev.task}: geomean speedup {ev.geomean_speedup:.3f}x over {base} ({ev.candidate.solution})"
    if not ev.candidate.eligible:
        n_failed = sum(r.status.failed for r in ev.candidate.results)
        return f"{ev.task}: {ev.candidate.solution} FAILED ({n_failed} workloads failed)"
    return f"{ev.task}: {ev.candidate.solution} correct; no geomean (no timed baseline)"


def overhead_line(wall_s: float, timed_s: float, phases_s: dict[str, float], top: int = 5) -> str:
    """Where the wall time went: timed calls, the solution's other calls (correctness calls
    with their JIT compile and autotuning, warm-up), and the harness's own work with its largest
    phases (seconds at 1 decimal; see d2kbench.phases)."""
    if not phases_s:
        return f"wall {wall_s:.1f} s, timed calls {timed_s:.1f} s, overhead {wall_s - timed_s:.1f} s"
    harness = harness_seconds(wall_s, phases_s)
    own = {k: v for k, v in phases_s.items() if k not in SOLUTION_PHASES}
    biggest = ", ".join(f"{k} {v:.1f}" for k, v in sorted(own.items(), key=lambda kv: -kv[1])[:top] if v >= 0.05)
    return (f"wall {wall_s:.1f} s, timed calls {timed_s:.1f} s, overhead {wall_s - timed_s:.1f} s = solution's other "
            f"calls (correctness, warm-up, JIT/autotune) {wall_s - timed_s - harness:.1f} s + harness {harness:.1f} s"
            + (f" ({biggest})" if biggest else ""))


def late_starts_line(runs) -> str | None:
    """A markdown bullet naming the events-mode results with late starts (samples whose window
    opened before the host had queued the call, so they may include host time; see
    ``d2kbench.harness.timing.PRIME_US``), or None when there are none. ``runs``: SolutionRuns."""
    late = [f"{run.solution} on {r.workload}: {r.timing.late_starts} of {r.timing.n}" for run in runs
            for r in run.results if r.timing and r.timing.late_starts]
    if not late:
        return None
    return ("- **late starts** (events samples whose window opened before the call was queued, so they may "
            "include host time): " + "; ".join(late))


def repeatability(evs: list[Evaluation]) -> list[dict]:
    """Per workload: the candidate's mean latency in each evaluation and the spread
    (max/min - 1, in %), plus each evaluation's harness overhead (wall - timed, s)."""
    out = []
    for wid in [r.workload for r in evs[0].candidate.results if r.timing]:
        means = [r.timing.mean_ms for ev in evs if (r := ev.candidate.result(wid)) and r.timing]
        if len(means) == len(evs):
            out.append({"workload": wid, "means_ms": means, "spread_pct": 100.0 * (max(means) / min(means) - 1.0)})
    return out


def to_markdown(evs: list[Evaluation], title: str) -> str:
    """A markdown page: environment, one table per evaluation, geomeans, repeatability."""
    env = evs[0].env
    lines = [f"# {title}", ""]
    keys = ("gpu", "driver", "cuda_runtime", "torch", "triton", "time_utc", "host")
    lines += [f"- **{k}**: {env.get(k)}" for k in keys if env.get(k) is not None]
    smi = env.get("smi") or {}
    if smi:
        lines.append(f"- **clocks at start**: SM {smi.get('clocks.sm')} MHz (max {smi.get('clocks.max.sm')}), "
                     f"memory {smi.get('clocks.mem')} MHz, power limit {smi.get('power.limit')} W")
    lines.append("")
    for n, ev in enumerate(evs, 1):
        base = ev.baseline.solution if ev.baseline else "none"
        lines += [f"## Evaluation {n}: `{ev.candidate.solution}` vs `{base}` on {ev.device} (id {ev.id})", "",
                  "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(r[c].replace("|", "/") for c in COLUMNS) + " |" for r in rows(ev)]
        lines += ["", summary(ev),
                  f"Harness: {overhead_line(ev.wall_s, ev.timed_s, ev.phases_s)}.", ""]
        late = late_starts_line([r for r in (ev.candidate, ev.baseline) if r is not None])
        lines += [late, ""] if late else []
    if len(evs) > 1:
        lines += ["## Repeatability", "", "| workload | mean ms per evaluation | spread % |", "|---|---|---|"]
        lines += [f"| {r['workload']} | {', '.join(f'{m:.4f}' for m in r['means_ms'])} | {r['spread_pct']:.2f} |"
                  for r in repeatability(evs)]
        geos = [ev.geomean_speedup for ev in evs if ev.geomean_speedup]
        if len(geos) == len(evs):
            lines += ["", f"Geomean speedups: {', '.join(f'{g:.3f}' for g in geos)} (mean of means {geomean(geos):.3f})."]
        lines.append("")
    return "\n".join(lines)
