"""The Muon tolerance accepts valid FP16 implementations and rejects the wrong variants.

Probes (task calibration.py) run through the task's real checks; the wrong variants also exist
as Triton solutions that must fail through the whole harness (on the H200 too: `-k cuda`).
"""

from __future__ import annotations

import itertools

import pytest
from conftest import DEVICES

from d2kbench.harness import calibrate as cal
from d2kbench.results import Status


def test_probes_separate_on_smoke_workloads(muon, monkeypatch):
    # fixed input seeds (the harness draws secret ones): the worst-draw margin below is then
    # reproducible instead of a random tail event
    monkeypatch.setattr(cal, "secret_seed", itertools.count(1).__next__)
    res = cal.calibrate(muon, list(muon.spec.smoke_workloads), "cpu", calls=1)
    v = cal.verdicts(res)
    assert {p: acc for p, (_, acc, _) in v.items()} == {
        "reference_fp16": True, "gram_restart_fp16": True, "bf16_iterate": False, "four_steps": False,
        "repeated_triple": False, "no_safety_factor": False, "batch_norm": False,
    }
    assert all(ok for _, _, ok in v.values())
    # the FP16 reference is within the FP64 tolerance with margin on every workload
    ref = [r for r in res if r.probe == "reference_fp16"]
    assert all(r.errors["out:oracle:rel_fro"] < 0.6 * r.thresholds["out:oracle:rel_fro"] for r in ref)


def test_unexpected_verdict_is_reported(muon, monkeypatch):
    from d2kbench.suite.muon_newton_schulz.calibration import PROBES

    monkeypatch.setattr(cal, "load_probes", lambda task: [(PROBES[0][0], PROBES[0][1], "reject")])
    res = cal.calibrate(muon, [muon.spec.workload("smoke_tall_1x64x48")], "cpu")
    assert cal.verdicts(res) == {"reference_fp16": ("reject", True, False)}
    assert "accepted (UNEXPECTED)" in cal.to_markdown(muon, res, {})


@pytest.mark.parametrize("solution", ["bf16_iterate", "wrong_values", "repeated_triple", "no_safety_factor"])
@pytest.mark.parametrize("device", DEVICES)
def test_wrong_variants_fail_the_harness(evaluate_cpu, solution, device):
    res = evaluate_cpu(solution, device=device, time_solutions=False).candidate.results[0]
    assert res.status is Status.INCORRECT, res.cause
    assert "rel_fro error" in res.cause or "finite" in res.cause
