"""The evaluation harness end to end on the CPU: every check has a solution that must fail it."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICES, SOLUTIONS

from d2kbench.harness.evaluate import Options, evaluate
from d2kbench.results import Status
from d2kbench.store import Store


@pytest.fixture(scope="module")
def straightforward_stored(evaluate_cpu, tmp_path_factory):
    """Muon straightforward against the reference on the CPU, every result recorded in a store:
    ``(evaluation, store, store path)``; shared by the timing and store tests below (the
    interpreter needs seconds per call)."""
    path = tmp_path_factory.mktemp("store") / "s.sqlite"
    store = Store(path)
    return evaluate_cpu("straightforward", baseline="reference", store=store), store, path


@pytest.mark.parametrize("device", DEVICES)
def test_straightforward_passes_with_timing(evaluate_cpu, device, request):
    ev = request.getfixturevalue("straightforward_stored")[0] if device == "cpu" else \
        evaluate_cpu("straightforward", baseline="reference", device=device)
    res = ev.candidate.results[0]
    assert res.status is Status.OK, res.cause
    # 3 calls before timing + 1 re-check after it, each with a structure, finite, 2 tolerance and 1 untouched check
    assert sorted({c.call for c in res.checks}) == [0, 1, 2, 3]
    oracle = [c for c in res.checks if c.against == "oracle"]
    assert len(oracle) == 4 and all(c.error < 1e-2 for c in oracle)
    assert res.timing is not None and res.timing.mode == ("cpu" if device == "cpu" else "events")
    assert res.timing.n == 3 if device == "cpu" else res.timing.n >= 10
    assert ev.baseline.results[0].status is Status.OK
    assert ev.geomean_speedup == pytest.approx(ev.scores[0].speedup)
    assert ev.scores[0].speedup == pytest.approx(ev.baseline.results[0].timing.mean_ms / res.timing.mean_ms)


@pytest.mark.parametrize(
    "solution, status, cause",
    [
        ("wrong_values", Status.INCORRECT, "out:oracle:rel_fro error"),
        ("nan_output", Status.INCORRECT, "out:finite"),
        ("unwritten", Status.INCORRECT, "NaN/Inf"),
        ("mutates_input", Status.INCORRECT, "G:untouched"),
        ("wrong_dtype", Status.INCORRECT, "dtype torch.float32, expected bfloat16"),
        ("wrong_count", Status.INCORRECT, "returned 2 outputs"),
        ("one_tuple", Status.INCORRECT, "outputs:container returned a tuple; the task's one output (out) is returned bare"),
        ("not_a_tensor", Status.INCORRECT, "numpy.ndarray, expected torch.Tensor"),
        ("alias_input", Status.INTEGRITY_VIOLATION, "no_aliasing"),
        ("subclass_output", Status.INTEGRITY_VIOLATION, "exact_tensor_type"),
        ("crash", Status.RUNTIME_ERROR, "kernel launch failed on purpose"),
        ("segfault", Status.RUNTIME_ERROR, "signal SIGSEGV"),
        ("exits", Status.RUNTIME_ERROR, "SystemExit"),
        ("oom", Status.OOM, "can't allocate memory"),
        ("syntax_error", Status.COMPILE_ERROR, "SyntaxError"),
        ("no_run", Status.COMPILE_ERROR, "defines no callable run()"),
    ],
)
@pytest.mark.parametrize("device", DEVICES)
def test_failing_solutions(evaluate_cpu, solution, status, cause, device):
    if device == "cuda" and solution == "oom":
        cause = "out of memory"
    ev = evaluate_cpu(solution, device=device)
    res = ev.candidate.results[0]
    assert res.status is status, f"{res.status}: {res.cause}"
    assert cause in res.cause
    assert not ev.candidate.eligible and ev.geomean_speedup is None


@pytest.mark.parametrize("device", DEVICES)
def test_stale_results_fail_on_second_call(evaluate_cpu, device):
    res = evaluate_cpu("stale_cache", device=device).candidate.results[0]
    assert res.status is Status.INCORRECT
    assert res.cause.startswith("call 1:")  # call 0 is right, the cached answer fails on fresh inputs
    assert all(c.passed for c in res.checks if c.call == 0)


def test_hang_times_out_and_harness_goes_on(evaluate_cpu, muon):
    ev = evaluate_cpu("hang", timeout_s=8)
    res = ev.candidate.results[0]
    assert res.status is Status.TIMEOUT and "within 8 s" in res.cause


def test_a_dead_worker_stops_the_solution_unless_keep_going(muon, tmp_path):
    from conftest import stage_with_muon_sf

    sol = stage_with_muon_sf(tmp_path) / "tall_crash.py"
    sol.write_text(
        "import os, signal\n"
        "import _muon_sf as sf\n"
        "def run(G, steps=5):\n"
        "    if G.shape[1] > G.shape[2]:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return sf.run(G, steps)\n"
    )
    wls = [muon.spec.workload("smoke_tall_1x64x48"), muon.spec.workload("smoke_wide_2x32x96")]
    ev = evaluate(muon, sol, wls, "cpu", None, options=Options(timeout_s=60, time_solutions=False, integrity=False,
                                                                keep_going=True))
    assert [r.status for r in ev.candidate.results] == [Status.RUNTIME_ERROR, Status.OK]
    assert "SIGKILL" in ev.candidate.results[0].cause
    # by default a dead worker stops the solution: its remaining workloads are not run
    ev = evaluate(muon, sol, wls, "cpu", None, options=Options(timeout_s=60, time_solutions=False, integrity=False))
    assert [r.status for r in ev.candidate.results] == [Status.RUNTIME_ERROR, Status.NOT_RUN]


def test_store_round_trip(straightforward_stored):
    ev, store, path = straightforward_stored
    rows = store.rows(task="muon_newton_schulz")
    assert {r["role"] for r in rows} == {"candidate", "baseline"}
    cand = [r for r in rows if r["role"] == "candidate"][0]
    assert cand["solution_sha256"] == ev.candidate.sha256 and cand["status"] == "ok"
    assert store.evaluation_states() == {ev.id: "complete"}  # every result written, then closed
    rec = store.result(cand)
    assert rec.timing.samples_ms == ev.candidate.results[0].timing.samples_ms  # every sample kept, unrounded
    assert store.env(cand["eval_id"])["torch"]
    store.close()
    # a second connection (as after a killed process) sees every committed row
    again = Store(path)
    assert len(again.rows()) == 2
    again.close()


def test_a_candidate_that_does_not_compile_fails_before_any_worker_starts(evaluate_cpu, muon):
    ev = evaluate(muon, SOLUTIONS / "muon" / "syntax_error.py", [muon.spec.workload(w) for w in
                  ("smoke_wide_2x32x96", "smoke_tall_1x64x48")], "cpu", "reference", options=Options())
    assert [r.status for r in ev.candidate.results] == [Status.COMPILE_ERROR] * 2
    assert ev.candidate.results[0].cause.startswith("does not compile: syntax_error.py:")
    # the baseline serves the candidate only: not started, not timed
    assert [r.status for r in ev.baseline.results] == [Status.NOT_RUN] * 2
    assert "candidate does not run" in ev.baseline.results[0].cause
    assert "worker_start" not in ev.phases_s and ev.timed_s == 0.0
    assert ev.scores[0].speedup is None and ev.geomean_speedup is None


def test_a_hang_stops_the_solution_and_the_baseline_is_not_timed_for_it(muon):
    """The first workload times out; the remaining ones are not run (no second timeout), and
    the baseline is not timed where the candidate failed."""
    wls = [muon.spec.workload(w) for w in ("smoke_wide_2x32x96", "smoke_tall_1x64x48", "smoke_square_3x40x40")]
    ev = evaluate(muon, SOLUTIONS / "muon" / "hang.py", wls, "cpu", "reference", options=Options(timeout_s=8))
    assert [r.status for r in ev.candidate.results] == [Status.TIMEOUT, Status.NOT_RUN, Status.NOT_RUN]
    assert "timeout on smoke_wide_2x32x96" in ev.candidate.results[1].cause and "--keep-going" in \
        ev.candidate.results[1].cause
    assert [r.status for r in ev.baseline.results] == [Status.OK, Status.NOT_RUN, Status.NOT_RUN]
    assert ev.baseline.results[0].timing is None and "not timed" in ev.baseline.results[0].cause
    kept = evaluate(muon, SOLUTIONS / "muon" / "hang.py", wls[:2], "cpu", None,
                    options=Options(timeout_s=8, keep_going=True, time_solutions=False))
    assert [r.status for r in kept.candidate.results] == [Status.TIMEOUT, Status.TIMEOUT]


def test_default_timeouts_follow_the_workload():
    from d2kbench.harness.deadlines import Deadlines

    cpu = Deadlines("cpu", cap_s=900)
    assert cpu.call(0.002) == pytest.approx(64.0)  # 60 s allowance + 2000 x the reference's 2 ms
    assert cpu.call(10.0) == 900  # never above the task's own limit
    assert cpu.timing(1.5) == pytest.approx(90.0)
    assert Deadlines("cpu", cap_s=900, explicit_s=8).call(5.0) == 8  # --timeout wins everywhere
    assert Deadlines("cuda", cap_s=600).call(0.05) == pytest.approx(310.0)


def test_restarted_workers_are_booked_as_start_up(muon):
    """A worker killed after a failed workload is started again before the next one, and that
    start-up is booked as worker_start."""
    wls = [muon.spec.workload(w) for w in ("smoke_wide_2x32x96", "smoke_tall_1x64x48")]
    # each start waits for its 1.5 s import; part of the first start hides under the parent's preparation of
    # the inputs (booked as prepare), more of it with two workloads to prepare than with one
    slow = SOLUTIONS / "muon" / "slow_import_crash.py"
    ev = evaluate(muon, slow, wls, "cpu", None, options=Options(time_solutions=False, integrity=False, keep_going=True))
    assert [r.status for r in ev.candidate.results] == [Status.RUNTIME_ERROR] * 2
    one = evaluate(muon, slow, wls[:1], "cpu", None, options=Options(time_solutions=False, integrity=False))
    assert ev.phases_s["worker_start"] > one.phases_s["worker_start"] + 0.5  # the second start is start-up
    assert ev.phases_s["worker_calls"] < ev.phases_s["worker_start"]


def test_killed_evaluation_keeps_recorded_rows(tmp_path):
    """SIGKILL an evaluating process (and its workers) midway: rows already written survive intact,
    the evaluation reads ``interrupted`` (its process is gone) and no report uses it."""
    import os
    import signal
    import sqlite3
    import subprocess
    import sys
    import time

    from conftest import stage_with_muon_sf

    sol = stage_with_muon_sf(tmp_path) / "hang_on_tall.py"
    sol.write_text(
        "import time\n"
        "import _muon_sf as sf\n"
        "def run(G, steps=5):\n"
        "    if G.shape[1] > G.shape[2]:\n"
        "        time.sleep(3600)\n"
        "    return sf.run(G, steps)\n"
    )
    db = tmp_path / "s.sqlite"
    script = (
        "from d2kbench.harness.evaluate import Options, evaluate\n"
        "from d2kbench.store import Store\n"
        "from d2kbench.tasks import load_task\n"
        "t = load_task('muon_newton_schulz')\n"
        f"evaluate(t, {str(sol)!r}, [t.spec.workload('smoke_wide_2x32x96'), t.spec.workload('smoke_tall_1x64x48')],\n"
        f"         'cpu', None, store=Store({str(db)!r}), options=Options(integrity=False))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.time() + 240
        rows = 0
        while time.time() < deadline and rows == 0:
            time.sleep(1)
            if db.exists():
                try:
                    rows = sqlite3.connect(db).execute("SELECT count(*) FROM results").fetchone()[0]
                except sqlite3.OperationalError:
                    rows = 0
        assert rows == 1, "the first workload was never recorded"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    store = Store(db)
    (row,) = store.rows()
    assert row["workload"] == "smoke_wide_2x32x96" and row["status"] == "ok"
    assert store.result(row).timing.n == 3
    assert store.evaluation_states() == {row["eval_id"]: "interrupted"}
    from d2kbench.report.data import Selection, load

    data = load(store, Selection(tasks=["muon_newton_schulz"]))
    assert data.solutions == {} and data.incomplete_evaluations == {"interrupted": 1}
    store.close()


def test_an_evaluation_that_raises_is_closed_interrupted(muon, tmp_path, monkeypatch):
    """An exception (here Ctrl-C) inside the evaluation after its first result: the evaluation is
    closed ``interrupted`` at once, its row kept."""
    import d2kbench.harness.evaluate as ev_mod
    from d2kbench.results import SolutionRun, Status, WorkloadResult

    def one_then_stop(task, entries, workloads, device, opts, env, ev_id, created, store, progress, **kw):
        run = SolutionRun(solution="x", path="x.py", sha256="ab", role="candidate")
        store.record(ev_id, task.id, run, WorkloadResult(workload=workloads[0].id, status=Status.OK), device, env,
                     created)
        raise KeyboardInterrupt

    monkeypatch.setattr(ev_mod, "run_solutions", one_then_stop)
    store = Store(tmp_path / "s.sqlite")
    with pytest.raises(KeyboardInterrupt):
        evaluate(muon, "straightforward", [muon.spec.workload("smoke_wide_2x32x96")], "cpu", None, store=store)
    (row,) = store.rows()
    assert store.evaluation_states() == {row["eval_id"]: "interrupted"}
    store.close()


def test_a_parent_side_failure_is_not_run_and_the_evaluation_goes_on(monkeypatch):
    """The trusted parent raises while it prepares one workload's expected values (here a CUDA
    out-of-memory of the reference on the 2x32x96 shape, as a 70B-vocabulary workload did on the
    H200): every solution gets ``not_run`` on that workload with the harness's cause, not a
    verdict of its own, and the next workload is judged normally."""
    import types

    from d2kbench.tasks import load_task

    task = load_task("muon_newton_schulz")
    real = task.reference_module()

    def run(G, steps=5):
        if G.shape[-2:] == (32, 96):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")
        return real.run(G, steps)

    fake = types.ModuleType("reference")
    fake.__dict__.update({k: v for k, v in vars(real).items() if not k.startswith("__")})
    fake.run = run
    monkeypatch.setattr(type(task), "reference_module", lambda self: fake)
    wls = [task.spec.workload("smoke_wide_2x32x96"), task.spec.workload("smoke_tall_1x64x48")]
    ev = evaluate(task, "reference", wls, "cpu", None,
                  options=Options(time_solutions=False, integrity=False, check_calls=1))
    first, second = ev.candidate.results
    assert first.status is Status.NOT_RUN
    assert first.cause.startswith("not run: the harness failed on smoke_wide_2x32x96 before judging: "
                                  "OutOfMemoryError: CUDA out of memory")
    assert second.status is Status.OK, second.cause
