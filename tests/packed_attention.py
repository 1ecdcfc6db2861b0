"""Helpers shared by the tests of the attention tasks over packed variable-length sequences
(``tests/test_task_varlen_flash_prefill.py``, ``tests/test_task_chunked_prefill_paged.py``):
packing of sequence lengths, the per-row error of an attention output, solution variants with a
classic bug, the GPU tile plan (interpreter off) and the checks both tasks' tests run alike.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from d2kbench.checking.inputs import make_args
from d2kbench.harness.calibrate import calibrate, verdicts
from d2kbench.tasks.loader import import_file


def task_args(task, workload: str, seed: int = 3) -> list:
    """The CPU inputs of one of ``task``'s workloads (by id) for ``seed``."""
    return make_args(task.reference_module(), task.spec, task.spec.workload(workload), seed, "cpu")


def cu_seqlens(lens: torch.Tensor) -> torch.Tensor:
    """The packing of sequences of lengths ``lens`` ([N], integers >= 0) one after the other:
    int32 [N + 1] starts, 0 first, the total length last (sequence i is rows cu[i]:cu[i + 1])."""
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lens, 0)
    return cu


def rel_rows(o: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest per-row relative error ``|o - ref| / |ref|`` (2-norms over the last dimension;
    rows: one token of one head), in float64."""
    return float(((o.double() - ref.double()).norm(dim=-1) / ref.double().norm(dim=-1)).max())


def solution_variant(task, base: str, old: str, new: str, dest: Path) -> Path:
    """``dest``: a copy of ``task``'s solution ``base`` with the text ``old`` (which must occur
    exactly once) replaced by ``new``."""
    src = (task.root / "solutions" / f"{base}.py").read_text()
    assert src.count(old) == 1, old
    dest.write_text(src.replace(old, new))
    return dest


def import_for_gpu(path: Path, name: str) -> ModuleType:
    """Import a solution with the interpreter off (its host code then plans the GPU's tiles);
    ``TRITON_INTERPRET`` is restored afterwards."""
    saved = os.environ.pop("TRITON_INTERPRET", None)
    try:
        return import_file(path, name=name)
    finally:
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved


def assert_names_missing_flashinfer(monkeypatch, path: Path, name: str, args: list) -> None:
    """The FlashInfer alternative at ``path``, without FlashInfer installed, raises a
    RuntimeError that names the package."""
    mod = import_file(path, name=name)
    monkeypatch.setitem(sys.modules, "flashinfer", None)          # import flashinfer -> ImportError
    with pytest.raises(RuntimeError, match="flashinfer"):
        mod.run(*args)


def assert_probes_separate(task, workloads: list[str]) -> None:
    """Every tolerance probe of ``task`` gets its expected verdict on the CPU smoke ``workloads``."""
    res = calibrate(task, [task.spec.workload(w) for w in workloads], "cpu", calls=1)
    for probe, (expect, accepted, as_expected) in verdicts(res).items():
        assert as_expected, (probe, expect, accepted, [(r.workload, r.errors) for r in res if r.probe == probe])
