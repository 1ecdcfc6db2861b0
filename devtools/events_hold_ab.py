"""A/B of the events timer's GPU spin: the same benchmark with no spin, a fixed spin before every
sample, and the default (keep the host ahead: a spin only where needed), interleaved.

:func:`d2kbench.harness.timing.time_events` spins the GPU (``torch.cuda._sleep``) so that the
host has launched a call before the GPU opens its event window (``timing.PRIME_US``). This
script measures what that changes: for each round it runs ``d2k bench``'s own code path
(:func:`d2kbench.harness.benchmark.benchmark`, solution workers, integrity on) once per timer in
:func:`modes` and tabulates per (solution, workload) the mean, median and min latency, the spin
in force at the end and the ``late_starts`` count (samples whose start event had fired before
the host finished queuing the call: their windows include host launch time).

Usage (repo root, a GPU)::

    PYTHONPATH=src python3 devtools/events_hold_ab.py TASK -w WORKLOAD [-w ...] -s SOL [-s ...]
        [--baseline SOL] [--rounds 2] [--fixed-us 850] [--json FILE] [--markdown FILE]

Diagnostic: the benchmark numbers come from ``d2k bench`` (the default timer).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from d2kbench.harness.benchmark import benchmark  # noqa: E402
from d2kbench.harness.evaluate import Options  # noqa: E402
from d2kbench.harness.summary import fmt_opt as f  # noqa: E402
from d2kbench.tasks.loader import load_task  # noqa: E402


def modes(fixed_us: float) -> dict[str, dict]:
    """The timers compared: label -> ``time_events`` keyword arguments."""
    return {"no spin": {"hold_us": 0.0}, f"fixed {fixed_us:g} us spin": {"hold_us": fixed_us}, "default": {}}


def ab_rows(task_id: str, workloads: list[str], solutions: list[str], baseline: str, rounds: int,
            fixed_us: float = 850.0) -> tuple[list[dict], dict]:
    """Run the A/B; returns one row per (round, mode, solution, workload) and the environment.

    Raises:
        KeyError: an unknown workload; FileNotFoundError: an unknown solution.
    """
    task = load_task(task_id)
    wls = [task.spec.workload(w) for w in workloads]
    rows, env = [], {}
    for rnd in range(rounds):
        for label, params in modes(fixed_us).items():
            opts = Options(check_calls=1, sensitivity=False, timing_params=dict(params))
            bench = benchmark(task, solutions, wls, "cuda", baseline, options=opts)
            env = bench.env
            for run in bench.runs:
                for r in run.results:
                    t = r.timing
                    rows.append({"round": rnd, "mode": label, "solution": run.solution, "workload": r.workload,
                                 "status": r.status.value, "mean_ms": t.mean_ms if t else None,
                                 "median_ms": t.median_ms if t else None, "min_ms": t.min_ms if t else None,
                                 "n": t.n if t else None, "hold_us": t.hold_us if t else None,
                                 "late_starts": t.late_starts if t else None})
            print(f"round {rnd} {label} done", file=sys.stderr, flush=True)
    return rows, env


def to_markdown(rows: list[dict], env: dict) -> str:
    """The rows as a table, with the environment in the header."""
    head = [f"# Events timer with and without a GPU spin before the samples ({env.get('gpu')}, driver {env.get('driver')}, "
            f"torch {env.get('torch')}, triton {env.get('triton')}, {env.get('time_utc')})", "",
            "Each round runs the benchmark once per timer, in the order shown (devtools/events_hold_ab.py). "
            "spin us: the per-sample spin in force at the end; late starts: samples whose start event had fired "
            "before the host finished queuing the call.", "",
            "| round | timer | solution | workload | mean ms | median ms | min ms | samples | spin us | late starts |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    body = [f"| {r['round']} | {r['mode']} | {r['solution']} | {r['workload']} | {f(r['mean_ms'], '.4f')} | "
            f"{f(r['median_ms'], '.4f')} | {f(r['min_ms'], '.4f')} | {f(r['n'], 'd')} | {f(r['hold_us'], '.0f')} | "
            f"{f(r['late_starts'], 'd')} |" for r in rows]
    return "\n".join(head + body) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("task")
    ap.add_argument("-w", "--workload", action="append", required=True)
    ap.add_argument("-s", "--solution", action="append", required=True)
    ap.add_argument("--baseline", default="reference")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--fixed-us", type=float, default=850.0, help="the fixed spin (us) of the second timer")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", type=Path)
    a = ap.parse_args()
    rows, env = ab_rows(a.task, a.workload, a.solution, a.baseline, a.rounds, a.fixed_us)
    page = to_markdown(rows, env)
    print(page)
    if a.json:
        a.json.write_text(json.dumps({"created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                                      "env": env, "rows": rows}, indent=1))
    if a.markdown:
        a.markdown.write_text(page)


if __name__ == "__main__":
    main()
