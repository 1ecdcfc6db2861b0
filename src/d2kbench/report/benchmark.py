"""Tables of a :class:`~d2kbench.harness.benchmark.BenchmarkResult` (markdown and plain rows)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from d2kbench.harness.benchmark import BenchmarkResult

_BAR = re.compile(r"^\s*([\w.\-/]+)\s*/\s*([\w.\-/]+)\s*>=\s*([0-9.]+)\s*$")


@dataclass(frozen=True)
class Bar:
    """A performance bar: ``solution`` must be at least ``factor`` x faster than ``over`` on
    every timed workload (mean latency ratio, both correct)."""

    solution: str
    over: str
    factor: float

    @classmethod
    def parse(cls, text: str) -> "Bar":
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


def _ms(bench: BenchmarkResult, sol: str, wl: str) -> str:
    r = bench.run(sol).result(wl)
    if r is None:
        return "-"
    if r.status.failed:
        return f"{r.status.value}"
    return f"{r.timing.mean_ms:.3f}" if r.timing else "ok"


def to_markdown(bench: BenchmarkResult, bars: list[Bar] = ()) -> str:
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
    how = {"events": "CUDA events with an L2 flush", "graph": "CUDA-graph replays", "cpu": "host timer (CPU)"}
    lines += [f"- **run**: id {bench.id}, wall {bench.wall_s:.1f} s, timed calls {bench.timed_s:.1f} s; solutions "
              f"interleaved per workload on the same inputs; {', '.join(how.get(m, m) for m in modes)}; per-call mean", ""]
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
    lines += ["", "## Achieved rates (each solution's own work model)", "",
              "| solution | workload | work model | mean ms | TFLOP/s | % bf16 ceiling | TB/s | % HBM ceiling |",
              "|---|---|---|---|---|---|---|---|"]
    for s in sols:
        for r in bench.rates.get(s, []):
            pb = "-" if r.pct_bf16_ceiling is None else f"{r.pct_bf16_ceiling:.1f}"
            ph = "-" if r.pct_hbm_ceiling is None else f"{r.pct_hbm_ceiling:.1f}"
            lines.append(f"| {s} | {r.workload} | {r.work_model} | {r.mean_ms:.3f} | {r.tflops:.1f} | {pb} | {r.tbps:.3f} | {ph} |")
    if bars:
        lines += ["", "## Bars", "", "| bar | workload | speedup | result |", "|---|---|---|---|"]
        for bar in bars:
            for w, s, ok in bar.check(bench):
                lines.append(f"| {bar.solution} / {bar.over} >= {bar.factor} | {w} | "
                             f"{'-' if s is None else f'{s:.3f}x'} | {'PASS' if ok else 'FAIL'} |")
    failed = [(s, r.workload, r.status.value, r.cause) for run in bench.runs for s in [run.solution]
              for r in run.results if r.status.failed]
    if failed:
        lines += ["", "## Failures", ""] + [f"- {s} on {w}: {st}: {c}" for s, w, st, c in failed]
    lines.append("")
    return "\n".join(lines)
