"""The evaluation harness end to end on the CPU: every check has a solution that must fail it."""

from __future__ import annotations

import pytest

from conftest import DEVICES
from d2kbench.harness.results import Status
from d2kbench.store import Store


@pytest.mark.parametrize("device", DEVICES)
def test_straightforward_passes_with_timing(evaluate_cpu, device):
    ev = evaluate_cpu("straightforward", baseline="reference", device=device)
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


def test_crash_on_one_workload_does_not_stop_the_next(muon, tmp_path):
    from d2kbench.harness.evaluate import Options, evaluate

    sol = tmp_path / "tall_crash.py"
    sol.write_text(
        "import os, signal\n"
        "from d2kbench.suite.muon_newton_schulz.solutions import straightforward as sf\n"
        "def run(G, steps=5):\n"
        "    if G.shape[1] > G.shape[2]:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return sf.run(G, steps)\n"
    )
    wls = [muon.spec.workload("smoke_tall_1x64x48"), muon.spec.workload("smoke_wide_2x32x96")]
    ev = evaluate(muon, sol, wls, "cpu", None, options=Options(timeout_s=60, time_solutions=False, integrity=False))
    assert [r.status for r in ev.candidate.results] == [Status.RUNTIME_ERROR, Status.OK]
    assert "SIGKILL" in ev.candidate.results[0].cause


def test_store_round_trip(evaluate_cpu, tmp_path):
    store = Store(tmp_path / "s.sqlite")
    ev = evaluate_cpu("straightforward", baseline="reference", store=store)
    rows = store.rows(task="muon_newton_schulz")
    assert {r["role"] for r in rows} == {"candidate", "baseline"}
    cand = [r for r in rows if r["role"] == "candidate"][0]
    assert cand["solution_sha256"] == ev.candidate.sha256 and cand["status"] == "ok"
    rec = store.result(cand)
    assert rec.timing.samples_ms == ev.candidate.results[0].timing.samples_ms  # every sample kept, unrounded
    assert store.env(cand["eval_id"])["torch"]
    store.close()
    # a second connection (as after a killed process) sees every committed row
    again = Store(tmp_path / "s.sqlite")
    assert len(again.rows()) == 2
    again.close()


def test_baseline_still_measured_when_candidate_fails(evaluate_cpu):
    ev = evaluate_cpu("syntax_error", baseline="reference")
    assert ev.candidate.results[0].status is Status.COMPILE_ERROR
    base = ev.baseline.results[0]
    assert base.status is Status.OK and base.timing is not None
    assert ev.scores[0].speedup is None and ev.geomean_speedup is None


def test_killed_evaluation_keeps_recorded_rows(tmp_path):
    """SIGKILL an evaluating process (and its workers) midway: rows already written survive intact."""
    import os
    import signal
    import sqlite3
    import subprocess
    import sys
    import time

    sol = tmp_path / "hang_on_tall.py"
    sol.write_text(
        "import time\n"
        "from d2kbench.suite.muon_newton_schulz.solutions import straightforward as sf\n"
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
    store.close()
