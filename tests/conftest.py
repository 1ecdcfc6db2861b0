"""Shared fixtures: the Muon task and a one-call evaluation helper for harness tests."""

from __future__ import annotations

import os
from pathlib import Path

import torch

if not torch.cuda.is_available():
    # Like a CPU worker process: Triton is interpreted from its first import on, so that the
    # kernels of Triton's own standard library (@triton.jit helpers) are interpreted too.
    # Set before any test module imports triton (torch itself does not).
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from d2kbench.harness.evaluate import Options, evaluate
from d2kbench.tasks import load_task

SOLUTIONS = Path(__file__).parent / "solutions"


@pytest.fixture(scope="session")
def muon():
    return load_task("muon_newton_schulz")


@pytest.fixture(scope="session")
def evaluate_cpu(muon):
    """Evaluate a solution on one small smoke workload (CPU by default), without a baseline.

    The test solutions here target one correctness check each and import the task's own
    straightforward kernels, which the integrity rules forbid; so integrity is off unless a
    test asks for it (the integrity suite tests those rules with its own evil solutions).
    """

    def run(solution, workload="smoke_wide_2x32x96", timeout_s=60.0, baseline=None, store=None, device="cpu",
            integrity=False, **opts):
        path = SOLUTIONS / "muon" / f"{solution}.py" if not str(solution) in muon.solutions() else solution
        return evaluate(muon, path, [muon.spec.workload(workload)], device, baseline, store=store,
                        options=Options(timeout_s=timeout_s, integrity=integrity, **opts))

    return run


#: Run a test on the CPU always and on the GPU where one is visible (the H200 runs `-k cuda`).
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]
