"""Zero false positives: every shipped solution of every task (reference, straightforward,
expert) passes with every integrity defence on, on the CPU smoke workloads.

For time on 2 CPU cores (the Triton interpreter needs seconds per call, and the suite grows to
26 tasks), each Triton solution runs on its first timed smoke workload plus the smoke workloads
its task's test file asserts on, with one timed sample; ``D2K_FP_ALL_SMOKE=1`` runs every smoke
workload (do that before a release). The references (trusted, fast) run on all of them. The
evaluations are shared with the task test files (``tests/shipped.py``): one per solution.

This file covers the references and the straightforward ports; the experts are in
``test_integrity_fp_expert.py`` (``pytest --dist loadfile`` keeps a file on one worker: two
files let both workers evaluate). The GPU variant (``-k cuda``) covers all three here.
"""

from __future__ import annotations

import pytest
from shipped import SOLUTIONS, assert_not_flagged, flagged, param

from d2kbench.harness.evaluate import Options, evaluate
from d2kbench.integrity.parent import external_edit_only as _external_edit_only
from d2kbench.tasks import load_task

#: References and straightforward ports (the experts: test_integrity_fp_expert.py).
NOT_EXPERT = [(t, n) for t, n in SOLUTIONS if n != "expert"]


@pytest.mark.parametrize("item", [param(t, n) for t, n in NOT_EXPERT])
def test_shipped_solution_is_not_flagged(item, shipped):
    assert_not_flagged(item, shipped.get(*item))


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
    assert not flagged(ev), flagged(ev)
