"""Tolerance calibration: run a task's probes (``calibration.py``: implementations the tolerance
must accept or reject) through the task's real checks and report the measured errors.

A probe is trusted PyTorch code, run in this process on the same inputs and with the same
expected values (reference, sampled FP64 oracle) as a solution would get.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from d2kbench.checking.expected import Expected
from d2kbench.checking.inputs import clone_args, make_args, secret_seed
from d2kbench.checking.verdict import check_reply
from d2kbench.tasks.loader import Task, import_file
from d2kbench.tasks.schema import Workload

# Imports inside functions: torch loads when a calibration runs, not when the CLI starts.


class ProbeResult(BaseModel):
    """One probe on one workload: the worst error of each check and whether all checks passed."""

    probe: str
    expect: str  # accept | reject
    workload: str
    errors: dict[str, float | None]  # check name -> measured error
    thresholds: dict[str, float | None]
    accepted: bool


def verdicts(results: list[ProbeResult]) -> dict[str, tuple[str, bool, bool]]:
    """Per probe: (expect, accepted on every workload, as expected). A solution fails the task
    when it fails any workload, so a probe to reject needs one failing workload."""
    out: dict[str, tuple[str, bool, bool]] = {}
    for r in results:
        expect, acc, _ = out.get(r.probe, (r.expect, True, True))
        acc = acc and r.accepted
        out[r.probe] = (expect, acc, acc == (expect == "accept"))
    return out


def load_probes(task: Task) -> list[tuple[str, Callable[..., Any], str]]:
    """The task's ``calibration.PROBES``.

    Raises:
        FileNotFoundError: the task has no calibration.py; ValueError: a malformed probe list.
    """
    path = task.root / "calibration.py"
    if not path.is_file():
        raise FileNotFoundError(f"task {task.id!r} has no calibration.py")
    probes = getattr(import_file(path), "PROBES", None)
    if not isinstance(probes, list) or not all(len(p) == 3 and p[2] in ("accept", "reject") for p in probes):
        raise ValueError(f"{path}: PROBES must be a list of (name, fn, 'accept'|'reject')")
    return probes


def calibrate(task: Task, workloads: list[Workload], device: str, calls: int = 1) -> list[ProbeResult]:
    """Every probe on every workload (``calls`` fresh input sets each; the worst error counts)."""
    import torch

    reference = task.reference_module()
    probes = load_probes(task)
    out: list[ProbeResult] = []
    for wl in workloads:
        per_probe: dict[str, tuple[dict, dict, bool]] = {}
        for call in range(calls):
            pristine = make_args(reference, task.spec, wl, secret_seed(), device)
            expected = Expected(task, reference, wl, pristine)
            for name, fn, _ in probes:
                args = clone_args(pristine)
                with torch.no_grad():
                    res = fn(*args)
                outs = list(res) if isinstance(res, (tuple, list)) else [res]
                reply = {"outputs": outs, "types": ["torch.Tensor"] * len(outs), "exact_tensor": [True] * len(outs),
                         "subclass": [False] * len(outs), "aliases": [], "container": type(res).__name__}
                checks, _ = check_reply(call, task.spec, wl, reference, args, expected, reply)
                errs, thr, ok = per_probe.get(name, ({}, {}, True))
                for c in checks:
                    if c.error is not None and (c.name not in errs or c.error > errs[c.name]):
                        errs[c.name], thr[c.name] = c.error, c.threshold
                per_probe[name] = (errs, thr, ok and all(c.passed for c in checks))
        for name, _, expect in probes:
            errs, thr, ok = per_probe[name]
            out.append(ProbeResult(probe=name, expect=expect, workload=wl.id, errors=errs, thresholds=thr, accepted=ok))
    return out


def to_markdown(task: Task, results: list[ProbeResult], env: dict) -> str:
    """A markdown table of the calibration: probe, workload, errors against thresholds, verdict."""
    names = sorted({k for r in results for k in r.errors if ":finite" not in k and ":untouched" not in k})
    lines = [f"# Tolerance calibration: {task.id}", ""]
    lines += [f"- **{k}**: {env.get(k)}" for k in ("gpu", "driver", "torch", "triton", "time_utc") if env.get(k)]
    lines += ["", "| probe | expect | workload | " + " | ".join(names) + " | verdict |",
              "|---|---|---|" + "---|" * (len(names) + 1)]
    for r in results:
        cells = []
        for n in names:
            e, t = r.errors.get(n), r.thresholds.get(n)
            cells.append("-" if e is None else f"{e:.2e}" + (f" / {t:.1e}" if t else ""))
        lines.append(f"| {r.probe} | {r.expect} | {r.workload} | " + " | ".join(cells)
                     + f" | {'passes' if r.accepted else 'fails'} |")
    lines += ["", "| probe | expect | verdict over all workloads |", "|---|---|---|"]
    for probe, (expect, acc, ok) in verdicts(results).items():
        lines.append(f"| {probe} | {expect} | {'accepted' if acc else 'rejected'}{'' if ok else ' (UNEXPECTED)'} |")
    lines.append("")
    return "\n".join(lines)
