"""``benchmark()`` and its report: several solutions side by side, bars, achieved rates."""

from __future__ import annotations

import pytest
from conftest import SOLUTIONS

from d2kbench.harness.benchmark import benchmark
from d2kbench.harness.evaluate import Options
from d2kbench.report.benchmark import Bar, to_markdown
from d2kbench.results import Status
from d2kbench.store import Store


def test_bar_parse():
    assert Bar.parse("expert/reference>=1.8") == Bar("expert", "reference", 1.8)
    with pytest.raises(ValueError, match="A/B>=FACTOR"):
        Bar.parse("expert faster than reference")


def test_benchmark_interleaves_solutions_and_checks_bars(muon, tmp_path):
    wls = [muon.spec.workload("smoke_tall_1x64x48")]
    with Store(tmp_path / "d2k.sqlite") as store:
        res = benchmark(muon, ["straightforward", str(SOLUTIONS / "muon" / "wrong_values.py")], wls, "cpu", "reference",
                        store=store, options=Options(timeout_s=60, integrity=False))
        # the bench's evaluation is closed in the store (reports use complete evaluations only)
        assert store.evaluation_states() == {res.id: "complete"}
        assert len(store.rows(None, None, 10)) == 3
    sf, bad, ref = (res.run(s) for s in ["straightforward", str(SOLUTIONS / "muon" / "wrong_values.py"), "reference"])
    assert sf.results[0].status is Status.OK and ref.results[0].status is Status.OK
    assert bad.results[0].status is Status.INCORRECT
    s = res.speedup("straightforward", "reference", "smoke_tall_1x64x48")
    assert s == pytest.approx(ref.results[0].timing.mean_ms / sf.results[0].timing.mean_ms)
    assert res.geomean_speedup("straightforward", "reference") == pytest.approx(s)
    # the interpreter is far slower than torch on the CPU: a 1x bar must fail, a tiny one pass
    assert Bar("straightforward", "reference", 1.0).check(res) == [("smoke_tall_1x64x48", s, False)]
    assert Bar("straightforward", "reference", s / 2).check(res)[0][2] is True
    # achieved rates count the work model the task file assigns (muon: expert -> gram_expert)
    assert res.rates["straightforward"][0].work_model == "reference"
    assert res.rates["straightforward"][0].pct_bf16_ceiling is None  # no GPU ceiling on the CPU
    page = to_markdown(res, [Bar("straightforward", "reference", 1.0)])
    assert "| straightforward / reference >= 1.0 | smoke_tall_1x64x48 |" in page and "FAIL" in page
    assert "wrong_values.py on smoke_tall_1x64x48: incorrect" in page


def test_work_model_of_solutions(muon):
    assert muon.spec.sol.work_of("expert")[0] == "gram_expert"
    assert muon.spec.sol.work_of("some/path.py")[0] == "reference"


def _bench_of(task, solution: str, results: list, env: dict, floors: dict):
    """A BenchmarkResult of one solution with given workload results (no GPU needed)."""
    from d2kbench.harness.benchmark import BenchmarkResult, rates_of
    from d2kbench.results import SolutionRun

    run = SolutionRun(solution=solution, path="-", sha256="-", role="candidate", results=results)
    wls = [task.spec.workload(r.workload) for r in results]
    return BenchmarkResult(id="x", task=task.id, device="cuda", created_at="-", baseline=solution, runs=[run],
                           rates={solution: rates_of(task, solution, run, wls, env, floors)}, env=env,
                           wall_s=1.0, timed_s=0.5, launch_floor_ms=floors)


def test_bound_bars_follow_each_workloads_bound_class(muon):
    from d2kbench.harness.timing import summarize
    from d2kbench.report.benchmark import BoundBar
    from d2kbench.results import WorkloadResult
    from d2kbench.scoring.sol import MEASURED, bound_of, sol_ms

    wl = muon.spec.workload("paper_8x7168x18432")
    h200 = MEASURED["H200"]
    assert bound_of(muon.spec, wl, h200) == "compute"  # the floor model's tensor-core term dominates
    assert bound_of(muon.spec, wl.model_copy(update={"bound": "latency"}), h200) == "latency"  # declared wins
    small = muon.spec.workload("smoke_wide_2x32x96")  # a roofline time of nanoseconds: below any launch
    assert bound_of(muon.spec, small, h200) == "memory" and bound_of(muon.spec, small, h200, 0.002) == "latency"
    assert bound_of(muon.spec, wl, h200, 0.002) == "compute"
    sol = sol_ms(muon.spec.sol.counts(muon.spec.sol.floor), wl.axes, h200)[0]
    env = {"gpu": "NVIDIA H200"}
    fast = WorkloadResult(workload=wl.id, status=Status.OK, timing=summarize([sol / 0.6] * 3, "events"))
    res = _bench_of(muon, "expert", [fast], env, {"events": 0.005})
    rate = res.rates["expert"][0]
    assert rate.bound == "compute" and rate.pct_sol == pytest.approx(60.0)
    assert rate.x_launch_floor == pytest.approx(sol / 0.6 / 0.005)
    assert BoundBar("expert").check(res) == [(wl.id, "compute", "% SOL >= 50", pytest.approx(60.0), True)]
    slow = WorkloadResult(workload=wl.id, status=Status.OK, timing=summarize([sol / 0.4] * 3, "events"))
    assert BoundBar("expert").check(_bench_of(muon, "expert", [slow], env, {}))[0][-1] is False  # 40% < 50%
    failed = WorkloadResult(workload=wl.id, status=Status.INCORRECT)
    assert BoundBar("expert").check(_bench_of(muon, "expert", [failed], env, {}))[0][-1] is False
    page = to_markdown(res, bound_bars=[BoundBar("expert")])
    assert "| expert: compute-bound, % SOL >= 50 | paper_8x7168x18432 | 60.00 | PASS |" in page


def test_latency_bar_uses_the_launch_floor(muon):
    from d2kbench.harness.timing import summarize
    from d2kbench.report.benchmark import BoundBar
    from d2kbench.results import WorkloadResult

    wl = muon.spec.workload("paper_32x2048x5464")
    latency = muon.spec.model_copy(update={"workloads": [
        w.model_copy(update={"bound": "latency"}) if w.id == wl.id else w for w in muon.spec.workloads]})
    task = type("T", (), {"spec": latency, "id": muon.id})()
    env = {"gpu": "NVIDIA H200"}
    for ms, ok in ((0.0125, True), (0.0175, False)):
        r = WorkloadResult(workload=wl.id, status=Status.OK, timing=summarize([ms] * 3, "graph", calls_per_sample=8))
        row = BoundBar("expert").check(_bench_of(task, "expert", [r], env, {"graph": 0.005}))[0]
        assert row[1:3] == ("latency", "x launch floor <= 3") and row[3] == pytest.approx(ms / 0.005) and row[4] is ok


def test_report_names_late_event_starts(muon):
    from d2kbench.harness.timing import summarize
    from d2kbench.results import WorkloadResult

    wl = "paper_8x7168x18432"
    env = {"gpu": "NVIDIA H200"}
    held = summarize([1.0] * 12, "events", l2_flush=True, hold_us=90.0, late_starts=0)
    late = summarize([1.0] * 12, "events", l2_flush=True, hold_us=180.0, late_starts=3)
    clean = to_markdown(_bench_of(muon, "expert", [WorkloadResult(workload=wl, status=Status.OK, timing=held)], env, {}))
    assert "late starts" not in clean and "CUDA events with an L2 flush, host kept ahead" in clean
    page = to_markdown(_bench_of(muon, "expert", [WorkloadResult(workload=wl, status=Status.OK, timing=late)], env, {}))
    assert f"expert on {wl}: 3 of 12" in page


def test_launch_floor_needs_a_gpu_and_a_gpu_timing_mode():
    import torch

    from d2kbench.harness.launch_floor import launch_floor_ms

    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="no launch floor"):
            launch_floor_ms("cpu")
        graph, events = launch_floor_ms("graph"), launch_floor_ms("events")
        assert 1e-4 < graph < events < 0.2  # ms: a graph replay amortises each launch's GPU-side cost
    else:
        with pytest.raises(RuntimeError, match="measured on a GPU"):
            launch_floor_ms("graph")


class _FakeAllocator:
    """An allocator whose figures the test sets: ``allocated`` before the call, the call's peak."""

    def __init__(self, before: int, peak: int):
        self.before, self.top, self.resets, self.syncs = before, peak, 0, 0

    def sync(self):
        self.syncs += 1

    def allocated(self):
        return self.before

    def reset_peak(self):
        self.resets += 1

    def peak(self):
        return self.top


def test_measure_call_reports_the_peak_above_the_inputs_and_the_outputs():
    import torch

    from d2kbench.harness.memory import measure_call, output_nbytes

    a, b = torch.zeros(10, dtype=torch.float32), torch.zeros(4, dtype=torch.float16)
    alloc = _FakeAllocator(before=1000, peak=1000 + 4096)
    result, mem = measure_call(lambda: (a, b, a[2:], 3), alloc)
    assert result[0] is a and alloc.resets == 1 and alloc.syncs == 2
    # a and its view share one storage: counted once
    assert mem.output_bytes == output_nbytes((a, b)) == 40 + 8 and mem.peak_bytes == 4096
    assert mem.extra_bytes == 4096 - 48
    assert measure_call(lambda: None, _FakeAllocator(500, 200))[1].peak_bytes == 0  # never negative


def test_report_shows_peak_memory_next_to_time(muon):
    from d2kbench.harness.timing import summarize
    from d2kbench.results import WorkloadResult

    wl = "paper_8x7168x18432"
    env = {"gpu": "NVIDIA H200"}
    plain = summarize([1.0] * 12, "events", l2_flush=True)
    page = to_markdown(_bench_of(muon, "expert", [WorkloadResult(workload=wl, status=Status.OK, timing=plain)], env, {}))
    assert "Peak device memory" not in page  # CPU runs and old records: no table
    mem = plain.model_copy(update={"peak_mem_bytes": 3 * 2 ** 30, "output_mem_bytes": 2 ** 30})
    page = to_markdown(_bench_of(muon, "expert", [WorkloadResult(workload=wl, status=Status.OK, timing=mem)], env, {}))
    assert "## Peak device memory of one call (MiB)" in page and f"| {wl} | 3072 (2048) |" in page


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a GPU")
def test_cuda_allocator_measures_a_workspace():
    import torch

    from d2kbench.harness.memory import CudaAllocatorStats, measure_call

    def call():
        work = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # freed before returning
        del work
        return torch.empty(1 << 20, dtype=torch.uint8, device="cuda")

    _, mem = measure_call(call, CudaAllocatorStats())
    assert mem.output_bytes == 1 << 20 and mem.peak_bytes >= (64 << 20) and mem.extra_bytes >= (63 << 20)
