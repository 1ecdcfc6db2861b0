"""Tables of a :class:`~d2kbench.harness.benchmark.BenchmarkResult` (markdown and plain rows)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from d2kbench.harness.benchmark import BenchmarkResult
from d2kbench.harness.summary import fmt_opt, late_starts_line, overhead_line
from d2kbench.tasks.loader import ALT_PREFIX, TaskFileError, load_task

_BAR = re.compile(r"^\s*([\w.:\-/]+)\s*/\s*([\w.:\-/]+)\s*>=\s*([0-9.]+)\s*$")


@dataclass(frozen=True)
class Bar:
    """A performance bar: ``solution`` must be at least ``factor`` x faster than ``over`` on
    every timed workload (mean latency ratio, both correct)."""

    solution: str
    over: str
    factor: float

    @classmethod
    def parse(cls, text: str) -> Bar:
        """``"expert/reference>=1.8"`` -> Bar. Raises ValueError on another form."""
        m = _BAR.match(text)
        if not m:
            raise ValueError(f"bar {text!r} is not of the form A/B>=FACTOR")
        return cls(m.group(1), m.group(2), float(m.group(3)))

    def check(self, bench: BenchmarkResult) -> list[tuple[str, float | None, bool]]:
        """(workload, speedup, passed) for every timed workload."""
        out = []
        for r in bench.run(self.solution).results:
            if r.correctness_only:
                continue
            s = bench.speedup(self.solution, self.over, r.workload)
            out.append((r.workload, s, s is not None and s >= self.factor))
        return out


#: The bars per bound class (docs/timing.md, "The bars a task's expert meets on the H200";
#: d2kbench.scoring.sol.bound_of): memory-bound workloads reach >= 70% of SOL on the measured
#: HBM ceiling, compute-bound ones >= 50% of SOL on the measured bf16 ceiling, latency-class
#: ones run within 3x of the measured launch floor.
BOUND_BARS = {"memory": ("pct_sol", ">=", 70.0), "compute": ("pct_sol", ">=", 50.0),
              "latency": ("x_launch_floor", "<=", 3.0)}
_METRIC_NAME = {"pct_sol": "% SOL", "x_launch_floor": "x launch floor"}


@dataclass(frozen=True)
class BoundBar:
    """``solution`` meets the bar of each timed workload's bound class (:data:`BOUND_BARS`)."""

    solution: str

    def check(self, bench: BenchmarkResult) -> list[tuple[str, str, str, float | None, bool]]:
        """(workload, bound, bar text, measured value, passed) per timed workload; a workload
        the solution failed (no rate) fails the bar."""
        rates = {r.workload: r for r in bench.rates.get(self.solution, [])}
        out: list[tuple[str, str, str, float | None, bool]] = []
        for res in bench.run(self.solution).results:
            if res.correctness_only:
                continue
            rate = rates.get(res.workload)
            bound = rate.bound if rate else None
            if bound not in BOUND_BARS:
                out.append((res.workload, bound or "?", "-", None, False))
                continue
            metric, op, limit = BOUND_BARS[bound]
            value = getattr(rate, metric)
            ok = value is not None and (value >= limit if op == ">=" else value <= limit)
            out.append((res.workload, bound, f"{_METRIC_NAME[metric]} {op} {limit:g}", value, ok))
        return out


def _ms(bench: BenchmarkResult, sol: str, wl: str) -> str:
    r = bench.run(sol).result(wl)
    if r is None:
        return "-"
    if r.status.failed:
        return f"{r.status.value}"
    return f"{r.timing.mean_ms:.3f}" if r.timing else "ok"


def _alternative_lines(bench: BenchmarkResult) -> list[str]:
    """A legend of the task's alternatives (``alt:NAME``) in the benchmark, with what each runs
    (from the task's ``task.yaml``; ``?`` when the task cannot be loaded). Empty without any."""
    alts = [r.solution for r in bench.runs if r.solution.startswith(ALT_PREFIX)]
    if not alts:
        return []
    try:
        desc = {ALT_PREFIX + a.name: a.description for a in load_task(bench.task).spec.alternatives}
    except TaskFileError:
        desc = {}
    return ["## Alternatives", "", "`alt:NAME` columns are what a user would run instead of writing the kernel "
            "(trusted code, checked like every solution).", "", "| solution | what it runs |", "|---|---|",
            *[f"| {a} | {desc.get(a, '?')} |" for a in alts], ""]


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2 ** 20:.0f}"


def _memory_lines(bench: BenchmarkResult, sols: list[str], workloads: list[str]) -> list[str]:
    """Peak device memory of one call per solution and workload (GPU runs; empty when no timing
    recorded it): ``peak (extra)`` in MiB, extra = peak minus the returned tensors."""
    cells, seen = {}, False
    for s in sols:
        for w in workloads:
            r = bench.run(s).result(w)
            t = r.timing if r is not None else None
            if t is None or t.peak_mem_bytes is None:
                cells[s, w] = "-"
                continue
            seen = True
            extra = max(0, t.peak_mem_bytes - (t.output_mem_bytes or 0))
            cells[s, w] = f"{_mib(t.peak_mem_bytes)} ({_mib(extra)})"
    if not seen:
        return []
    return ["", "## Peak device memory of one call (MiB)", "",
            "Allocated during one call after the timing loop, above what was allocated before it; in "
            "parentheses the extra memory: the peak minus the returned tensors (d2kbench.harness.memory).", "",
            "| workload | " + " | ".join(sols) + " |", "|---|" + "---|" * len(sols),
            *[f"| {w} | " + " | ".join(cells[s, w] for s in sols) + " |" for w in workloads]]


def to_markdown(bench: BenchmarkResult, bars: Sequence[Bar] = (), bound_bars: Sequence[BoundBar] = ()) -> str:
    """A markdown page: environment, latencies, speedups, achieved rates, bars."""
    env = bench.env
    sols = [r.solution for r in bench.runs]
    lines = [f"# {bench.task}: {', '.join(sols[:-1])} vs {bench.baseline}", ""]
    keys = ("gpu", "driver", "cuda_runtime", "torch", "triton", "time_utc")
    lines += [f"- **{k}**: {env.get(k)}" for k in keys if env.get(k) is not None]
    smi, after = env.get("smi") or {}, env.get("smi_after") or {}
    if smi:
        lines.append(f"- **clocks**: SM {smi.get('clocks.sm')} MHz at start, {after.get('clocks.sm', '?')} MHz at end "
                     f"(max {smi.get('clocks.max.sm')}); power limit {smi.get('power.limit')} W")
    modes = sorted({r.timing.mode for run in bench.runs for r in run.results if r.timing})
    how = {"events": "CUDA events with an L2 flush, host kept ahead", "graph": "CUDA-graph replays",
           "cpu": "host timer (CPU)"}
    lines += [f"- **run**: id {bench.id}; solutions interleaved per workload on the same inputs; "
              f"{', '.join(how.get(m, m) for m in modes)}; per-call mean",
              f"- **harness**: {overhead_line(bench.wall_s, bench.timed_s, bench.phases_s)}", ""]
    late = late_starts_line(bench.runs)
    lines += [late, ""] if late else []
    lines += _alternative_lines(bench)
    workloads = [r.workload for r in bench.runs[0].results]
    lines += ["## Mean latency (ms) and status", "", "| workload | " + " | ".join(sols) + " |",
              "|---|" + "---|" * len(sols)]
    lines += [f"| {w} | " + " | ".join(_ms(bench, s, w) for s in sols) + " |" for w in workloads]
    pairs = [(a, b) for i, a in enumerate(sols) for b in sols[i + 1:]]
    timed = [r.workload for r in bench.runs[0].results if not r.correctness_only]
    lines += ["", "## Speedups (mean latency ratio)", "", "| workload | " + " | ".join(f"{a} / {b}" for a, b in pairs) + " |",
              "|---|" + "---|" * len(pairs)]
    for w in timed:
        vals = [bench.speedup(a, b, w) for a, b in pairs]
        lines.append(f"| {w} | " + " | ".join("-" if v is None else f"{v:.3f}x" for v in vals) + " |")
    geos = [bench.geomean_speedup(a, b) for a, b in pairs]
    lines.append("| **geomean** | " + " | ".join("-" if g is None else f"**{g:.3f}x**" for g in geos) + " |")
    floors = ", ".join(f"{m} {v * 1e3:.2f} us" for m, v in sorted(bench.launch_floor_ms.items()))
    lines += ["", "## Achieved rates (each solution's own work model)", "",
              "% SOL: the task's floor work model at the measured ceilings / mean latency. "
              f"Launch floor (a one-store Triton kernel, measured in this run): {floors or '-'}.", "",
              "| solution | workload | bound | work model | mean ms | TFLOP/s | % bf16 ceiling | TB/s | % HBM ceiling "
              "| % SOL | x launch floor |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in sols:
        for r in bench.rates.get(s, []):
            lines.append(f"| {s} | {r.workload} | {r.bound or '-'} | {r.work_model} | {r.mean_ms:.4f} | {r.tflops:.1f} | "
                         f"{fmt_opt(r.pct_bf16_ceiling, '.1f')} | {r.tbps:.3f} | {fmt_opt(r.pct_hbm_ceiling, '.1f')} | "
                         f"{fmt_opt(r.pct_sol, '.1f')} | {fmt_opt(r.x_launch_floor, '.2f')} |")
    lines += _memory_lines(bench, sols, workloads)
    if bars or bound_bars:
        lines += ["", "## Bars", "", "| bar | workload | measured | result |", "|---|---|---|---|"]
        for bar in bars:
            for w, speedup, ok in bar.check(bench):
                lines.append(f"| {bar.solution} / {bar.over} >= {bar.factor} | {w} | "
                             f"{'-' if speedup is None else f'{speedup:.3f}x'} | {'PASS' if ok else 'FAIL'} |")
        for bb in bound_bars:
            for w, bound, text, v, ok in bb.check(bench):
                lines.append(f"| {bb.solution}: {bound}-bound, {text} | {w} | {fmt_opt(v, '.2f')} | {'PASS' if ok else 'FAIL'} |")
    failed = [(s, r.workload, r.status.value, r.cause) for run in bench.runs for s in [run.solution]
              for r in run.results if r.status.failed]
    if failed:
        lines += ["", "## Failures", ""] + [f"- {s} on {w}: {st}: {c}" for s, w, st, c in failed]
    lines.append("")
    return "\n".join(lines)
