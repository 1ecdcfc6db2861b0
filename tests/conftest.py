"""Shared fixtures: the Muon task and a one-call evaluation helper for harness tests."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

if not torch.cuda.is_available():
    # Like a CPU worker process: Triton is interpreted from its first import on, so that the
    # kernels of Triton's own standard library (@triton.jit helpers) are interpreted too.
    # Set before any test module imports triton (torch itself does not).
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The CLI tests read rich tables: give them a width that holds a task id whatever the terminal
# (pytest-xdist workers have none, and rich falls back to 80 columns).
os.environ.setdefault("COLUMNS", "200")

import pytest  # noqa: E402

from d2kbench.harness import interpreter_numerics  # noqa: E402

if os.environ.get("TRITON_INTERPRET") == "1":
    interpreter_numerics.install()  # as in every CPU worker: sm_90's float conversions and fma

from shipped import ShippedEvaluations, needed  # noqa: E402

from d2kbench.harness.evaluate import Options, evaluate  # noqa: E402
from d2kbench.tasks import load_task  # noqa: E402

#: The Muon task's straightforward solution, staged as ``_muon_sf.py`` next to test solutions
#: that reuse its kernels (a worker sees only the solution's own folder, never the suite's).
MUON_SF = Path(__file__).resolve().parents[1] / "src/d2kbench/suite/muon_newton_schulz/solutions/straightforward.py"


def stage_with_muon_sf(folder: Path) -> Path:
    """Put a copy of the Muon straightforward solution into ``folder`` as ``_muon_sf.py``."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(MUON_SF, folder / "_muon_sf.py")
    return folder


def _stage_solutions() -> Path:
    """A private copy of ``tests/solutions`` with ``_muon_sf.py`` next to the Muon ones."""
    dest = Path(tempfile.mkdtemp(prefix="d2k-test-solutions-"))
    shutil.copytree(Path(__file__).parent / "solutions", dest, dirs_exist_ok=True)
    stage_with_muon_sf(dest / "muon")
    return dest


SOLUTIONS = _stage_solutions()


def _shipped_root(tmp_path_factory) -> Path:
    """The folder of the session's shared evaluations: common to all pytest-xdist workers of the
    run (the parent of their base temp folders, the controller's own base temp folder)."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shipped"


@pytest.fixture(scope="session")
def shipped(tmp_path_factory, request):
    """The session's shared evaluations of the shipped solutions (``tests/shipped.py``). At the end
    each process writes what it evaluated and how long it waited for another worker's evaluation
    (``stats-<worker>.json``), summed in the run's terminal summary."""
    ev = ShippedEvaluations(_shipped_root(tmp_path_factory))
    ev.backlog = needed(request.session.items)
    yield ev
    ev.write_stats(os.environ.get("PYTEST_XDIST_WORKER", "main"))


def pytest_terminal_summary(terminalreporter, config):
    """One line on the shared evaluations: how many, their seconds, and the seconds workers
    spent waiting for one another's (a waiting worker leaves its core idle)."""
    factory = getattr(config, "_tmp_path_factory", None)
    if factory is None:
        return
    line = ShippedEvaluations.summary(_shipped_root(factory))
    if line:
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def muon():
    return load_task("muon_newton_schulz")


@pytest.fixture(scope="session")
def evaluate_cpu(muon):
    """Evaluate a solution on one small smoke workload (CPU by default), without a baseline.

    The test solutions here target one correctness check each and import the task's own
    straightforward kernels (``_muon_sf``), whose PyTorch glue the integrity rules would flag
    in some of them; so integrity is off unless a test asks for it (the integrity suite tests
    those rules with its own evil solutions).
    """

    def run(solution, workload="smoke_wide_2x32x96", timeout_s=60.0, baseline=None, store=None, device="cpu",
            integrity=False, **opts):
        path = SOLUTIONS / "muon" / f"{solution}.py" if str(solution) not in muon.solutions() else solution
        return evaluate(muon, path, [muon.spec.workload(workload)], device, baseline, store=store,
                        options=Options(timeout_s=timeout_s, integrity=integrity, **opts))

    return run


#: Run a test on the CPU always and on the GPU where one is visible (the H200 runs `-k cuda`).
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]
