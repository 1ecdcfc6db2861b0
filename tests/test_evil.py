"""The evil-solution suite: every known cheat in ``evil/`` is rejected with the expected status
and rule (and the static review reports the expected AST rules).

The whole CPU suite runs once per session, four evaluations at a time (each evil file gets its
own worker, 3 correctness calls, the smallest smoke workload); each case is then its own test.
On a machine with a GPU the ``cuda`` variant runs every case, GPU-only ones included, on the GPU.
"""

from __future__ import annotations

import pytest
import torch

from d2kbench.harness.evil import EVIL_DIR, discover, run_suite

CPU_CASES = discover(EVIL_DIR, "cpu")
ALL_CASES = discover(EVIL_DIR, "cuda")
_CACHE: dict = {}
#: Evaluations at a time: two, as many as CI's cores (the test run keeps both busy: vmstat showed
#: 0% idle through a run, the worker start-ups being CPU-bound imports). More at a time only won a
#: larger share of a machine shared with other jobs. On the GPU two, so that timings stay undisturbed.
JOBS = {"cpu": 2, "cuda": 2}


def _outcomes(device: str) -> dict:
    if device not in _CACHE:
        cases = CPU_CASES if device == "cpu" else ALL_CASES
        _CACHE[device] = {f"{o.task}/{o.name}": o for o in run_suite(cases, device, jobs=JOBS[device])}
    return _CACHE[device]


def _explain(o) -> str:
    return (f"{o.task}/{o.name}: expected {o.expected_status}/{o.expected_rule}, got {o.status} {o.rules}: "
            f"{o.problem} | evidence: {o.evidence[:300]}")


@pytest.mark.parametrize("case", CPU_CASES, ids=[f"{c.task}/{c.name}" for c in CPU_CASES])
def test_evil_rejected_cpu(case):
    o = _outcomes("cpu")[f"{case.task}/{case.name}"]
    assert o.passed, _explain(o)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: GPU-only cheats (side streams, CUDA graphs, "
                                                          "profiler cross-checks) run on the H200 with -k cuda")
@pytest.mark.parametrize("case", ALL_CASES, ids=[f"{c.task}/{c.name}" for c in ALL_CASES])
def test_evil_rejected_cuda(case):
    o = _outcomes("cuda")[f"{case.task}/{case.name}"]
    assert o.passed, _explain(o)


def test_suite_covers_gpu_only_tricks():
    gpu_only = {f"{c.task}/{c.name}" for c in ALL_CASES} - {f"{c.task}/{c.name}" for c in CPU_CASES}
    assert {"muon_newton_schulz/side_stream", "graph_probe/capture_aware"} <= gpu_only
