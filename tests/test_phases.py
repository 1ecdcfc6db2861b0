"""Where the harness's time goes: the phase clock, its use in an evaluation, and the expected
values that the integrity protocol's extra calls share instead of computing twice."""

from __future__ import annotations

import time
import types

import pytest
import torch

from d2kbench.checking.expected import Expected, Prefetch
from d2kbench.checking.inputs import make_args
from d2kbench.checking.verdict import EXTRA_CALL_ORACLE_SLICES, Checker
from d2kbench.phases import SOLUTION_PHASES, PhaseClock, harness_seconds, phase
from d2kbench.results import Status


def test_nested_phases_are_exclusive():
    clock = PhaseClock()
    with clock.active():
        with phase("outer"):
            time.sleep(0.05)
            with phase("inner"):
                time.sleep(0.1)
            time.sleep(0.05)
    t = clock.snapshot()
    assert t["inner"] == pytest.approx(0.1, abs=0.03)
    assert t["outer"] == pytest.approx(0.1, abs=0.03)  # the inner 0.1 s is not counted twice


def test_phase_without_active_clock_is_a_no_op():
    clock = PhaseClock()
    with phase("x"):
        pass
    assert clock.snapshot() == {}


def test_move_reassigns_seconds_and_ignores_bad_values():
    clock = PhaseClock()
    clock.add("timing_request", 5.0)
    clock.move("timing_request", {"timing_samples": 3.0, "timing_warmup": 1.5, "timing_bogus": -7.0, "x": "y"})
    t = clock.snapshot()
    assert t["timing_request"] == pytest.approx(0.5)
    assert t["timing_samples"] == 3.0 and t["timing_warmup"] == 1.5
    assert "timing_bogus" not in t and "x" not in t


def test_harness_seconds_excludes_the_solutions_own_calls():
    phases = {"worker_run": 4.0, "timing_samples": 10.0, "timing_warmup": 1.0, "oracle": 3.0, "worker_start": 2.0}
    assert set(SOLUTION_PHASES) == {"worker_run", "timing_samples", "timing_warmup"}
    assert harness_seconds(20.0, phases) == pytest.approx(5.0)


@pytest.fixture(scope="module")
def prefetch_spied_evaluation(evaluate_cpu):
    """One evaluation (Muon straightforward against the reference, integrity on) with
    ``Prefetch.take`` spied on: ``(evaluation, [whether each take returned prefetched values])``.
    Shared by the tests below (the interpreter needs seconds per call)."""
    taken = []
    original = Prefetch.take

    def spy(self, workload):
        got = original(self, workload)
        taken.append(got is not None)
        return got

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Prefetch, "take", spy)
        ev = evaluate_cpu("straightforward", baseline="reference", integrity=True)
    return ev, taken


def test_evaluation_reports_phases_that_add_up_to_the_wall_time(prefetch_spied_evaluation):
    ev, _ = prefetch_spied_evaluation
    assert ev.candidate.results[0].status is Status.OK, ev.candidate.results[0].cause
    p = ev.phases_s
    assert sum(p.values()) == pytest.approx(ev.wall_s, rel=1e-6)
    assert abs(p["unaccounted"]) < 0.1 * ev.wall_s
    for name in ("worker_start", "inputs", "reference", "oracle", "worker_run", "checks",
                 "integrity_sensitivity", "timing_samples"):
        assert p.get(name, 0.0) > 0.0, name
    assert p["timing_samples"] == pytest.approx(ev.timed_s, rel=1e-6)  # CPU timer: one call per sample


class _Counting:
    """A task reference whose ``run`` and ``oracle`` count their calls."""

    def __init__(self, ref):
        self.ref = ref
        self.runs = 0
        self.oracles = 0

    def module(self):
        def run(*a):
            self.runs += 1
            return self.ref.run(*a)

        def oracle(*a):
            self.oracles += 1
            return self.ref.oracle(*a)

        return types.SimpleNamespace(run=run, oracle=oracle, make_inputs=self.ref.make_inputs)


def test_checker_computes_expected_values_once_per_input_list(muon):
    wl = muon.spec.workload("smoke_wide_2x32x96")
    counting = _Counting(muon.reference_module())
    ref = counting.module()
    checker = Checker(muon, ref, wl)
    pristine = make_args(ref, muon.spec, wl, 7, "cpu")
    first, _ = checker.expected(pristine)
    again, _ = checker.expected(pristine)
    assert counting.runs == 1 and first is again
    adopted = Expected(muon, ref, wl, make_args(ref, muon.spec, wl, 8, "cpu"))
    adopted.reference()
    checker.adopt(adopted.pristine, adopted)
    checker.expected(adopted.pristine)
    assert counting.runs == 2  # the adopted values were reused, not recomputed


def test_extra_calls_sample_fewer_oracle_slices(muon):
    wl = muon.spec.workload("smoke_wide_2x32x96")
    ref = muon.reference_module()
    tol = next(t for t in wl.checks_for("out", muon.spec.outputs[0].checks) if t.against == "oracle")
    assert tol.sample.count == 2
    full = Expected(muon, ref, wl, make_args(ref, muon.spec, wl, 1, "cpu"))
    (axis, idx), outs = full.oracle(tol)
    assert axis == "B" and len(idx) == 2 and outs[0].shape[0] == 2
    light = Checker(muon, ref, wl)._expected(make_args(ref, muon.spec, wl, 1, "cpu"))
    (_, idx1), outs1 = light.oracle(tol)
    assert len(idx1) == EXTRA_CALL_ORACLE_SLICES == 1 and outs1[0].shape[0] == 1


def test_prefetch_prepares_fresh_calls_within_its_budget(muon):
    wl = muon.spec.workload("smoke_wide_2x32x96")
    counting = _Counting(muon.reference_module())
    ref = counting.module()
    pre = Prefetch(muon, ref, [wl], "cpu", calls=3, budget_bytes=1 << 30)
    assert [pre.step() for _ in range(4)] == [True, True, True, False]  # the plan has 3 calls
    assert counting.runs == 3 and counting.oracles == 3  # reference and oracle slices computed ahead
    held = pre.held_bytes
    assert held > 0
    calls = [pre.take(wl) for _ in range(3)]
    assert pre.take(wl) is None and pre.held_bytes == 0
    firsts = [c[0][0] for c in calls]  # each call's own secret inputs
    assert not torch.equal(firsts[0], firsts[1]) and not torch.equal(firsts[1], firsts[2])
    for pristine, expected in calls:  # taken calls need nothing recomputed
        expected.reference()
        assert expected.pristine is pristine
    assert counting.runs == 3

    tight = Prefetch(muon, ref, [wl], "cpu", calls=3, budget_bytes=1)
    assert tight.step() is True and tight.step() is False  # the first call already spends the budget
    assert len(tight.ready[wl.id]) == 1


def test_prefetch_stops_on_a_failure_and_holds_nothing(muon, monkeypatch):
    wl = muon.spec.workload("smoke_wide_2x32x96")

    def boom(self):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (test)")

    monkeypatch.setattr(Expected, "precompute", boom)
    pre = Prefetch(muon, muon.reference_module(), [wl], "cpu", calls=3, budget_bytes=1 << 30)
    assert pre.step() is False and pre.step() is False
    assert pre.take(wl) is None and pre.held_bytes == 0


def test_evaluation_checks_against_calls_prefetched_while_workers_start(prefetch_spied_evaluation):
    ev, taken = prefetch_spied_evaluation
    assert ev.candidate.results[0].status is Status.OK and ev.baseline.results[0].status is Status.OK
    # the 3 correctness calls (not the re-check after timing) come from the prefetch: the workers
    # take seconds to import torch, the smoke calls milliseconds to prepare
    assert len(taken) == 3 and any(taken)
