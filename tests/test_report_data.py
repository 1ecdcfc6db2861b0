"""Reading the store: cross-checks that must fail on inconsistent rows, machines, task-only stores."""

from __future__ import annotations

import pytest
import synthetic_store as syn

from d2kbench.report.build import build_report
from d2kbench.report.data import Selection, load
from d2kbench.scoring.baseline import parse_baseline
from d2kbench.scoring.metrics import ScoringError
from d2kbench.store import Store


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "t.sqlite")
    yield s
    s.close()


def add_solutions(store, env=syn.H200_ENV, tag=""):
    for name, lat in syn.SOLUTIONS["toy_softmax"].items():
        syn.add_evaluation(store, f"toy.{name}{tag}", "toy_softmax", name, syn.sha(name), "candidate", lat, env)


def test_a_candidate_marked_eligible_with_failed_rows_is_caught(store):
    add_solutions(store)
    rid = syn.add_run(store, "m", "none", "toy_softmax", [(1, syn.FAIL)])
    store.conn.execute("UPDATE candidates SET eligible = 1 WHERE run_id = ?", (rid,))
    store.conn.commit()
    with pytest.raises(ScoringError, match="marked eligible=True but its evaluation .* has failed workloads"):
        load(store)


def test_a_candidate_marked_ineligible_that_passed_is_caught(store):
    add_solutions(store)
    rid = syn.add_run(store, "m", "none", "toy_softmax", [(1, (1.0, 1.0))])
    store.conn.execute("UPDATE candidates SET eligible = 0 WHERE run_id = ?", (rid,))
    store.conn.commit()
    with pytest.raises(ScoringError, match="marked eligible=False but its evaluation .* passed every workload"):
        load(store)


def test_an_evaluation_of_another_source_is_caught(store):
    add_solutions(store)
    rid = syn.add_run(store, "m", "none", "toy_softmax", [(1, (1.0, 1.0))])
    store.conn.execute("UPDATE candidates SET solution_sha256 = ? WHERE run_id = ?", (syn.sha("other"), rid))
    store.conn.commit()
    with pytest.raises(ScoringError, match="timed source .*, not the candidate's"):
        load(store)


def test_eligible_without_an_evaluation_is_caught(store):
    add_solutions(store)
    rid = syn.add_run(store, "m", "none", "toy_softmax", [(1, (1.0, 1.0))])
    store.conn.execute("UPDATE candidates SET eval_id = NULL WHERE run_id = ?", (rid,))
    store.conn.commit()
    with pytest.raises(ScoringError, match="marked eligible=True but its evaluation None has no result rows"):
        load(store)


def test_results_of_several_machines_need_a_choice(store):
    add_solutions(store)
    add_solutions(store, syn.CPU_ENV, tag=".cpu")
    syn.add_run(store, "m", "none", "toy_softmax", [(1, (0.5, 2.0))])
    with pytest.raises(ScoringError, match="several machines \\(H200, cpu\\): choose one \\(--hardware\\)"):
        load(store)
    on_h200 = load(store, hardware="NVIDIA H200")
    assert on_h200.hardware == "H200" and [r.run_id for r in on_h200.runs] == ["m.none.toy_softmax"]
    on_cpu = load(store, hardware="cpu")
    assert on_cpu.runs == []  # the run's candidates ran on the H200
    assert on_cpu.solutions["toy_softmax"]["expert"]["w1"].mean_ms == 0.25


def test_a_failed_solution_workload_is_kept_as_failed(store):
    syn.add_evaluation(store, "e1", "toy_softmax", "expert", syn.sha("expert"), "candidate", syn.FAIL)
    data = load(store)
    w1 = data.solutions["toy_softmax"]["expert"]["w1"]
    assert (w1.mean_ms, w1.n_ok, w1.n_failed, w1.last_status) == (None, 0, 1, "incorrect")
    assert data.solution_ms()["toy_softmax"]["expert"] == {"w2": 1.0}


def test_task_pages_from_a_store_without_runs(store, tmp_path):
    """A store of ``d2k eval`` results only (as results/h200 will hold): task pages and no tables."""
    for task, sols in syn.SOLUTIONS.items():
        for name, lat in sols.items():
            syn.add_evaluation(store, f"{task}.{name}", task, name, syn.sha(task + name), "candidate", lat)
    data = load(store, Selection(tasks=["muon_newton_schulz"]))
    assert data.tasks == ["muon_newton_schulz"] and data.runs == []
    files = build_report(data, parse_baseline("reference"), tmp_path / "out", ["md", "csv"])
    names = sorted(str(f.relative_to(tmp_path / "out")) for f in files)
    assert names == ["report.md", "tables/muon_newton_schulz_latency.csv", "tables/muon_newton_schulz_roofline.csv",
                     "tables/muon_newton_schulz_sol.csv", "tasks/muon_newton_schulz.md"]
    main = (tmp_path / "out" / "report.md").read_text()
    assert "The selection holds no agent runs" in main and "Table 1" not in main
    page = (tmp_path / "out" / "tasks" / "muon_newton_schulz.md").read_text()
    assert "| expert | task solution" in page and "| 2.500 |" in page
    flags = {line.rsplit(",", 1)[1] for line in (tmp_path / "out" / "tables" / "muon_newton_schulz_roofline.csv")
             .read_text().splitlines()[1:]}
    assert flags == {"", "beats reference-derived bound"}  # the expert (16 ms) is under the 17.6 ms reference bound
    everything = load(store)
    assert everything.tasks == ["muon_newton_schulz", "toy_softmax"]


def test_report_formats_are_checked(store, tmp_path):
    add_solutions(store)
    with pytest.raises(ValueError, match="unknown report format\\(s\\) \\['pdf'\\]"):
        build_report(load(store), parse_baseline("reference"), tmp_path, ["md", "pdf"])


def test_only_the_latest_settled_attempt_of_a_planned_run_counts(store):
    add_solutions(store)
    # the rows come back ordered by run_id (attempt 2 first): the attempt number decides, not the order
    syn.add_run(store, "m", "none", "toy_softmax", [(1, (1.0, 4.0))], rid="k#2", run_key="k", attempt=2)
    first = syn.add_run(store, "m", "none", "toy_softmax", [(1, (0.5, 2.0))], status="failed", rid="k~1",
                        run_key="k", attempt=1)  # an agent error, retried
    dead = syn.add_run(store, "m", "L1+L2+L3", "toy_softmax", [], status="interrupted")
    data = load(store)
    assert [r.run_id for r in data.runs] == ["k#2"]
    assert data.skipped == {first: "attempt 1, superseded by k#2", dead: "interrupted"}
    assert data.usage["k#2"].turns == 3 and data.skipped_usage.turns == 6  # left-out turns are still accounted
    from d2kbench.report.build import score
    from d2kbench.report.tables import table6

    assert score(data, parse_baseline("reference")).runs[0].speedup == 1.0  # the retry's kernel, not attempt 1's
    assert "not in the table: 6 turns of left-out runs" in table6(data)[0].notes[0]
