"""Zero false positives: every shipped solution of every task (reference, straightforward,
expert) passes with every integrity defence on, on the CPU smoke workloads.

For time on 2 CPU cores (the Triton interpreter needs seconds per call, and the suite grows to
26 tasks), each Triton solution runs on its first timed smoke workload plus the smoke workloads
its task's test file asserts on, with one timed sample; ``D2K_FP_ALL_SMOKE=1`` runs every smoke
workload (do that before a release). The references (trusted, fast) run on all of them. The
evaluations are shared with the task test files (``tests/shipped.py``): one per solution.
"""

from __future__ import annotations

import pytest
from shipped import SOLUTIONS

from d2kbench.harness.evaluate import Options, evaluate
from d2kbench.integrity.parent import external_edit_only as _external_edit_only
from d2kbench.tasks import load_task


def _flagged(ev) -> list[str]:
    return [f"{r.workload}: {r.status.value}: {r.cause[:200]}; violations {[(v.rule, v.evidence[:120]) for v in r.violations]}"
            for r in ev.candidate.results if r.status.value != "ok" or r.violations]


@pytest.mark.parametrize("item", SOLUTIONS, ids=[f"{t}/{n}" for t, n in SOLUTIONS])
def test_shipped_solution_is_not_flagged(item, shipped):
    ev = shipped.get(*item)
    assert not _flagged(ev), _flagged(ev)
    res = [r for r in ev.candidate.results if not r.correctness_only]
    if item[1] != "reference":  # the integrity protocol really ran: sensitivity call and timed outputs
        assert res, "no timed smoke workload ran"
        assert any(c.name == "sensitivity" and c.passed for r in ev.candidate.results for c in r.integrity_checks)
        mutable = any(getattr(a, "mutable", False) for a in load_task(item[0]).spec.args)
        if not mutable:  # timed outputs of tasks with state updates are not re-checked (their state drifts)
            assert all(any(c.name.startswith("timed#") for c in r.integrity_checks) for r in res)


_CUDA: dict = {}


@pytest.mark.skipif(not __import__("torch").cuda.is_available(),
                    reason="no GPU: the profiler, kernel-name, hidden-work and L2 checks only run on the GPU (H200: -k cuda)")
@pytest.mark.parametrize("item", SOLUTIONS, ids=[f"{t}/{n}" for t, n in SOLUTIONS])
def test_shipped_solution_is_not_flagged_cuda(item):
    """The GPU-only defences on a real registered workload: no false positives either."""
    task_id, name = item
    if item not in _CUDA:
        task = load_task(task_id)
        wl = [w for w in task.spec.workloads if not w.correctness_only][:1]
        ev = evaluate(task, name, wl, "cuda", None, options=Options(timeout_s=900))
        if _external_edit_only(ev):
            ev = evaluate(task, name, wl, "cuda", None, options=Options(timeout_s=900))
        _CUDA[item] = ev
    ev = _CUDA[item]
    assert not _flagged(ev), _flagged(ev)
