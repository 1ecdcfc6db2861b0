"""Numerical checks and timing statistics, on hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from d2kbench.checking import checks
from d2kbench.harness.timing import (
    HOLD_MAX_US,
    HOLD_MIN_US,
    MIN_GRAPH_CALLS,
    graph_passes,
    hold_us_for,
    sample_count,
    summarize,
    time_cpu,
)
from d2kbench.tasks.schema import Tolerance


def tol(**kw):
    return Tolerance(rationale="test", **kw)


def test_rel_fro_per_slice_takes_the_worst_matrix():
    exp = torch.ones(3, 2, 2, dtype=torch.float64)
    out = exp.clone()
    out[1, 0, 0] = 2.0  # ||diff|| = 1, ||exp|| = 2 -> 0.5 on matrix 1, 0 elsewhere
    err, worst = checks.rel_fro(out, exp, [1, 2])
    assert err == pytest.approx(0.5) and worst == 1
    whole, _ = checks.rel_fro(out, exp, [])
    assert whole == pytest.approx(1 / math.sqrt(12))


def test_compare_rel_fro_threshold_is_inclusive_and_fails_above():
    exp = torch.ones(1, 2, 2)
    t = tol(metric="rel_fro", max=0.25, slice_dims=["M", "N"])
    dim_of = ["B", "M", "N"].index
    ok = checks.compare(0, "o", t, exp * 1.25, exp, dim_of)
    bad = checks.compare(0, "o", t, exp * 1.26, exp, dim_of)
    assert ok.passed and ok.error == pytest.approx(0.25)
    assert not bad.passed and bad.error == pytest.approx(0.26)


def test_compare_nan_is_never_within_tolerance():
    exp = torch.ones(4)
    out = exp.clone()
    out[2] = float("nan")
    r = checks.compare(0, "o", tol(metric="rel_fro", max=1e9), out, exp, [0].index)
    assert not r.passed and r.error == math.inf
    f = checks.finite(0, "o", out)
    assert not f.passed and "1 of 4 elements are NaN/Inf (first at (2,))" in f.detail


def test_allclose_mismatch_fraction():
    exp = torch.zeros(10)
    out = exp.clone()
    out[:3] = 1.0
    t = tol(metric="allclose", atol=0.5, rtol=0.0, max_mismatch=0.2)
    r = checks.compare(0, "o", t, out, exp, [0].index)
    assert not r.passed and r.error == pytest.approx(0.3)
    t2 = tol(metric="allclose", atol=0.5, rtol=0.0, max_mismatch=0.3)
    assert checks.compare(0, "o", t2, out, exp, [0].index).passed


def test_exact_compares_bits():
    a = torch.tensor([0.0, 1.0])
    b = torch.tensor([-0.0, 1.0])  # equal as numbers, different bits
    r = checks.compare(0, "o", tol(metric="exact"), a, b, [0].index)
    assert not r.passed and "1 elements differ" in r.detail
    assert checks.compare(0, "o", tol(metric="exact"), a, a.clone(), [0].index).passed


def test_untouched_reports_first_modified_element():
    before = torch.arange(6.0).reshape(2, 3)
    now = before.clone()
    now[1, 2] = -1
    r = checks.untouched(0, "G", now, before)
    assert not r.passed and "(1, 2)" in r.detail
    assert checks.untouched(0, "G", before.clone(), before).passed


def test_structure_checks_shape_dtype_type(muon):
    spec = muon.spec.outputs[0]
    wl = muon.spec.workload("smoke_wide_2x32x96")
    good = torch.empty(2, 32, 96, dtype=torch.bfloat16)
    assert checks.structure(0, spec, good, wl).passed
    assert "shape [2, 96, 32]" in checks.structure(0, spec, good.mT, wl).detail
    assert "dtype torch.float16" in checks.structure(0, spec, good.half(), wl).detail
    assert "list" in checks.structure(0, spec, [good], wl).detail


def test_summarize_statistics():
    s = summarize([1.0, 2.0, 3.0, 4.0, 10.0], "events")
    assert s.mean_ms == pytest.approx(4.0) and s.median_ms == pytest.approx(3.0)
    assert s.p10_ms == pytest.approx(np.percentile([1, 2, 3, 4, 10], 10))
    assert s.std_ms == pytest.approx(np.std([1, 2, 3, 4, 10], ddof=1))
    assert s.ci95_low_ms <= s.mean_ms <= s.ci95_high_ms
    assert s.min_ms == 1.0 and s.max_ms == 10.0 and s.samples_ms == [1.0, 2.0, 3.0, 4.0, 10.0]
    assert summarize([1.0, 2.0, 3.0, 4.0, 10.0], "events") == s  # deterministic interval


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [-1.0]])
def test_summarize_rejects_bad_samples(bad):
    with pytest.raises(ValueError):
        summarize(bad, "events")


def test_graph_passes_fill_short_replays_like_the_launch_floor():
    assert MIN_GRAPH_CALLS == 64  # the launch floor's calls per graph
    assert graph_passes(3, 0.03) == 22  # a few-us call on 3 sets: 66 calls per replay
    assert graph_passes(3, 0.08) == 22  # the same whatever the solution's host overhead
    assert graph_passes(1, 0.12) == 64
    assert graph_passes(1, 0.4) == 50  # bounded by 20 ms of repeated work (50 x 0.4 ms)
    assert graph_passes(3, 7.0) == 1  # long calls: one pass, they amortise the replay by themselves
    assert graph_passes(256, 0.01) == 1  # many input sets are many calls already
    assert graph_passes(64, 0.0) == 1 and graph_passes(2, float("nan")) == 1  # no estimate: one pass


def test_events_hold_covers_the_host_queuing_time():
    assert hold_us_for(30.0) == 90.0  # 3x the host's time to queue a timed call
    assert hold_us_for(5.0) == HOLD_MIN_US == 50.0  # never shorter than 50 us
    assert hold_us_for(20_000.0) == HOLD_MAX_US  # a call that waits for the GPU: capped
    assert hold_us_for(float("nan")) == HOLD_MAX_US and hold_us_for(float("inf")) == HOLD_MAX_US


def _fake_cuda(monkeypatch, late):
    """A CPU stand-in for the CUDA calls of ``time_events``: ``late(i)`` says whether the start
    event of sample ``i`` has fired when the host queries it; returns the spins queued (us)."""
    from d2kbench.harness import timing

    spins: list[float] = []

    class Event:
        made = 0

        def __init__(self, enable_timing=False):
            self.index, Event.made = Event.made, Event.made + 1

        def record(self):
            pass

        def query(self):
            return late(self.index)

        def elapsed_time(self, end):
            return 1.0

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: spins.append(float(cycles)))
    monkeypatch.setattr(timing, "_sleep_cycles_per_us", lambda: 1.0)  # cycles == us
    return spins


@pytest.mark.parametrize("pattern, late_starts, per_sample_spins", [
    ("first", 1, 0),   # one late start (the first sample): no per-sample spin
    ("alternate", 10, 0),  # never two in a row: the host keeps up
    ("all", 20, 18),   # two in a row: the host is behind, samples 2..19 start with a spin
])
def test_events_timer_spins_only_when_the_host_stays_behind(monkeypatch, pattern, late_starts, per_sample_spins):
    from d2kbench.harness.timing import PRIME_US, time_events

    late = {"first": lambda i: i == 0, "alternate": lambda i: i % 2 == 0, "all": lambda i: True}[pattern]
    spins = _fake_cuda(monkeypatch, late)
    stats = time_events(lambda i: None, 1, flush=lambda: None, warmup_ms=0.0, min_samples=20, max_samples=20)
    assert stats.n == 20 and stats.late_starts == late_starts
    assert spins[0] == PRIME_US  # the first spin, before the first sample (a fast host: the 2 ms minimum)
    assert len(spins) - 1 == per_sample_spins
    assert (stats.hold_us > 0) == (per_sample_spins > 0)


def test_events_timer_without_spin_counts_late_starts_only(monkeypatch):
    from d2kbench.harness.timing import time_events

    spins = _fake_cuda(monkeypatch, lambda i: True)
    stats = time_events(lambda i: None, 1, flush=lambda: None, warmup_ms=0.0, min_samples=12, max_samples=12,
                        hold_us=0)
    assert spins == [] and stats.late_starts == 12 and stats.hold_us == 0


def test_sample_count_clamps():
    assert sample_count(100.0) == 15  # 1500 ms target / 100 ms
    assert sample_count(1000.0) == 10  # at least 10
    assert sample_count(0.001) == 200  # at most 200


def test_time_cpu_cycles_input_sets():
    seen = []
    stats = time_cpu(seen.append, n_sets=2, samples=4, warmup=1)
    assert seen == [0, 0, 1, 0, 1] and stats.n == 4 and stats.mode == "cpu"


def test_rel_fro_in_chunks_equals_one_pass(monkeypatch):
    x = torch.randn(5, 33, 17, dtype=torch.float64)
    y = x + 0.01 * torch.randn(5, 33, 17, dtype=torch.float64)
    whole = (checks.rel_fro(x, y, [1, 2]), checks.rel_fro(x, y, []))
    monkeypatch.setattr(checks, "_CHUNK_ELEMS", 10)  # rows and columns both split
    chunked = (checks.rel_fro(x, y, [1, 2]), checks.rel_fro(x, y, []))
    assert chunked[0][1] == whole[0][1] and chunked[0][0] == pytest.approx(whole[0][0], rel=1e-12)
    assert chunked[1][0] == pytest.approx(whole[1][0], rel=1e-12)
    t = tol(metric="allclose", atol=0.005, rtol=0.0)
    assert checks.compare(0, "o", t, x, y, [0, 1, 2].index).error == pytest.approx(
        float(((x - y).abs() > 0.005).sum()) / x.numel())


def test_unchanged_checks_only_what_the_reference_left_alone():
    """State pools: slots the reference did not write must keep their bits; written slots are
    left to the other checks (here slot 1 is written, slot 0 is a canary)."""
    before = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    exp = torch.tensor([[1.0, 2.0], [5.0, 6.0]])
    t = tol(metric="unchanged")
    dim_of = ["S", "X"].index
    good = torch.tensor([[1.0, 2.0], [5.5, 6.5]])           # written slot differs from the reference: not this check's job
    assert checks.compare(0, "state", t, good, exp, dim_of, before=before).passed
    bad = torch.tensor([[1.0, 2.0000002], [5.0, 6.0]])      # one ulp in a canary slot
    r = checks.compare(0, "state", t, bad, exp, dim_of, before=before)
    assert not r.passed and r.error == pytest.approx(0.5) and "first at (0, 1)" in r.detail
    nan = torch.tensor([[float("nan"), 2.0], [5.0, 6.0]])
    assert not checks.compare(0, "state", t, nan, exp, dim_of, before=before).passed
    assert not checks.compare(0, "state", t, good, exp, dim_of).passed   # no value before the call: fails, says why


def test_unchanged_per_slot_ignores_old_bits_repeated_in_a_rewritten_slot():
    """With slice_dims, a slot the reference rewrote is not a canary even where one of its new
    elements equals the old bits (seen on the H200: extreme decays keep a state element); an
    honest solution one rounding step off there passes, element-wise judging fails it, and a
    touched canary slot still fails."""
    before = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    exp = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.5, 6.5], [7.0, 8.0, 9.0]])   # slot 1 written; its 4.0 kept
    honest = torch.tensor([[1.0, 2.0, 3.0], [4.0000005, 5.5, 6.5], [7.0, 8.0, 9.0]])
    dim_of = ["NS", "X"].index
    per_slot = tol(metric="unchanged", slice_dims=["X"])
    assert checks.compare(0, "state", per_slot, honest, exp, dim_of, before=before).passed
    assert not checks.compare(0, "state", tol(metric="unchanged"), honest, exp, dim_of, before=before).passed
    canary = honest.clone()
    canary[2, 1] = 8.000001                                                   # one ulp in canary slot 2
    r = checks.compare(0, "state", per_slot, canary, exp, dim_of, before=before)
    assert not r.passed and "slice 2" in r.detail and r.error == pytest.approx(1 / 6)
    wrong_slot = exp.clone()
    wrong_slot[0] = 0.0                                                       # a write into canary slot 0
    assert not checks.compare(0, "state", per_slot, wrong_slot, exp, dim_of, before=before).passed


def test_unchanged_is_refused_on_outputs():
    from d2kbench.tasks.schema import OutputSpec, TaskSpec
    with pytest.raises(ValueError, match="state_checks only"):
        TaskSpec(id="t", title="t", category="serving", origin=["x"], description="d",
                 args=[{"name": "x", "kind": "tensor", "shape": ["N"], "dtype": "float32"}],
                 outputs=[OutputSpec(name="y", shape=["N"], dtype="float32", checks=[tol(metric="unchanged")])],
                 workloads=[{"id": "w", "axes": {"N": 4}}], smoke_workloads=[{"id": "s", "axes": {"N": 2}}],
                 timing={"mode": "events"}, sol={"reference": {}})
