"""SOL bounds, utilisation and the flags for beating the reference-derived bound or the floor."""

from __future__ import annotations

import pytest

from d2kbench.scoring.roofline import SOL_VIOLATION_TOLERANCE, roofline, sol_bounds
from d2kbench.scoring.sol import DATASHEET, MEASURED, ceilings
from d2kbench.tasks.schema import SolSpec, WorkCounts

# a GEMM-like reference (2*M*N*K FLOPs) and a variant doing half the FLOPs (e.g. a symmetric product)
SOL = SolSpec(reference=WorkCounts(tc_flops="2 * M * N * K", bytes="2 * (M * K + K * N + M * N)"),
              variants={"half": WorkCounts(tc_flops="M * N * K", bytes="2 * (M * K + K * N + M * N)")}, floor="half")
AXES = {"M": 4096, "N": 4096, "K": 4096}
FLOPS = 2 * 4096**3
BYTES = 2 * 3 * 4096**2


def test_ceiling_tables_cover_h200_h100_b200():
    assert set(DATASHEET) == {"H200", "H100", "B200"}
    assert ceilings("NVIDIA H200", "datasheet").bf16_tflops == 989.0
    assert ceilings("H200", "measured") is MEASURED["H200"]
    with pytest.raises(ValueError, match="no measured ceilings for GPU 'B200' \\(known: H200\\)"):
        ceilings("B200", "measured")
    with pytest.raises(ValueError, match="no datasheet ceilings for GPU 'MI300X'"):
        ceilings("MI300X")
    with pytest.raises(ValueError, match="unknown ceiling tier 'peak'"):
        ceilings("H200", "peak")


def test_bounds_by_hand_on_h200():
    b = sol_bounds(SOL, AXES, "H200")
    assert b.sol_reference_ms == pytest.approx(FLOPS / 989e12 * 1e3, rel=1e-12)  # 0.139 ms, compute-bound
    assert b.reference_bound == "tensor_core"
    assert b.sol_floor_ms == pytest.approx(FLOPS / 2 / 989e12 * 1e3, rel=1e-12)
    assert b.sol_floor_measured_ms == pytest.approx(FLOPS / 2 / 790e12 * 1e3, rel=1e-12)
    assert b.floor_variant == "half"
    # a skinny shape is memory-bound: bytes / 4.8 TB/s
    skinny = sol_bounds(SOL, {"M": 16, "N": 8192, "K": 8192}, "H200")
    assert skinny.reference_bound == "memory"
    assert skinny.sol_reference_ms == pytest.approx(2 * (16 * 8192 * 2 + 8192**2) / 4.8e12 * 1e3, rel=1e-12)
    # no measured table for B200: the measured floor is absent, the datasheet one is not
    assert sol_bounds(SOL, AXES, "B200").sol_floor_measured_ms is None


def test_utilisation_and_gap_closed():
    b = sol_bounds(SOL, AXES, "H200")
    r = roofline(SOL, AXES, 2 * b.sol_floor_ms, "H200", baseline_ms=5 * b.sol_floor_ms)
    assert r.utilisation == pytest.approx(0.5, rel=1e-12)
    assert r.utilisation_measured == pytest.approx(0.5 * 989 / 790, rel=1e-12)
    assert r.gap_closed == pytest.approx(3 / 4, rel=1e-12)  # (5 - 2) / (5 - 1)
    assert roofline(SOL, AXES, 1.0, "H200").gap_closed is None
    assert roofline(SOL, AXES, 1.0, "H200", baseline_ms=b.sol_floor_ms / 2).gap_closed is None


def test_flags_beating_the_reference_bound_and_the_floor():
    b = sol_bounds(SOL, AXES, "H200")
    slow = roofline(SOL, AXES, 1.1 * b.sol_reference_ms, "H200")
    assert not slow.beats_reference_bound and not slow.sol_violation
    # between the floor and the reference-derived bound: an algorithmic change, allowed
    algo = roofline(SOL, AXES, 0.75 * b.sol_reference_ms, "H200")
    assert algo.beats_reference_bound and not algo.sol_violation
    # within the 2% tolerance under the floor: not yet a violation
    near = roofline(SOL, AXES, (1 - SOL_VIOLATION_TOLERANCE / 2) * b.sol_floor_ms, "H200")
    assert near.beats_reference_bound and not near.sol_violation
    # beyond it: physically implausible
    fake = roofline(SOL, AXES, (1 - 2 * SOL_VIOLATION_TOLERANCE) * b.sol_floor_ms, "H200")
    assert fake.sol_violation and fake.utilisation > 1.0


def test_roofline_rejects_bad_latency_and_unknown_gpu():
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="latency must be a finite positive"):
            roofline(SOL, AXES, bad, "H200")
    with pytest.raises(ValueError, match="no datasheet ceilings for GPU 'cpu'"):
        roofline(SOL, AXES, 1.0, "cpu")
