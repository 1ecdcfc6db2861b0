"""Reading the store: cross-checks that must fail on inconsistent rows, machines, task-only stores."""

from __future__ import annotations

import json

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
    # the runs of these tests are of campaign "paper": its plan declares model m on the toy task
    s.record_plan("paper", {"name": "paper", "design": "ablation", "tasks": ["toy_softmax"],
                            "agents": [{"model": "m", "backend": "openai"}]})
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
                     "tables/muon_newton_schulz_roofline.notes.txt", "tables/muon_newton_schulz_sol.csv",
                     "tasks/muon_newton_schulz.md"]
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


def test_a_recorded_final_candidate_that_the_rule_would_not_pick_is_an_error(store):
    add_solutions(store)
    # latencies 1.00 and 0.98 ms: the rule picks the second; the store says the first (the old
    # rule's choice from own-evaluation speedups 1.30 vs 1.28)
    rid = syn.add_run(store, "m", "none", "toy_softmax", [(1, (1.0, 1.0)), (2, (0.98, 0.98))])
    first = store.candidates_of(rid)[0]["id"]
    with store.conn:
        store.conn.execute("UPDATE runs SET final_candidate = ? WHERE run_id = ?", (first, rid))
    with pytest.raises(ScoringError, match=f"records candidate {first} as the final answer, but the final-selection "
                                           f"rule .* selects {first + 1}"):
        load(store)


def test_a_candidate_whose_evaluation_was_interrupted_is_left_out_and_every_path_says_so(store, tmp_path):
    """Two candidates of one run: 1.0 / 1.0 ms (complete) and 0.5 / 0.5 ms (its evaluation was
    interrupted). Against the reference (1.0 / 4.0 ms) the run scores geomean(1, 4) = 2.0 from
    the complete one, not geomean(2, 8) = 4.0, and the score, the tables and the report say
    what they left out."""
    from typer.testing import CliRunner

    from d2kbench.cli import app
    from d2kbench.report import tables
    from d2kbench.report.build import score

    add_solutions(store)
    rid = syn.add_run(store, "m", "none", "toy_softmax", [(1, (1.0, 1.0)), (2, (0.5, 0.5))])
    first, second = store.candidates_of(rid)
    with store.conn:  # the runner recorded the final from the complete evaluation only
        store.conn.execute("UPDATE evaluations SET status = 'interrupted' WHERE eval_id = ?", (second["eval_id"],))
        store.conn.execute("UPDATE runs SET final_candidate = ? WHERE run_id = ?", (first["id"], rid))
    data = load(store, Selection(guidance=["none"]))
    assert data.incomplete_candidates == {rid: [f"candidate {second['id']} (turn 2): evaluation "
                                                f"{second['eval_id']} interrupted"]}
    sheet = score(data, parse_baseline("reference"))
    assert sheet.runs[0].speedup == pytest.approx(2.0) and sheet.runs[0].final_candidate == first["id"]
    note = "candidates left out because their evaluation is running or interrupted: m / none / toy_softmax: 1."
    for t in (tables.table1(sheet), tables.table4(sheet), tables.table5(sheet), tables.group_table(sheet),
              tables.ablation_table(sheet)):
        assert any(note in n for n in t.notes), t.key
    assert "1 run(s) scored without candidates whose evaluation is not complete" in sheet.missing_summary()
    res = CliRunner().invoke(app, ["score", "--store", str(store.path), "--guidance", "none"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert f"left out of run {rid} (evaluation not complete): candidate {second['id']}" in res.output
    assert note in " ".join(res.output.split())
    build_report(data, parse_baseline("reference"), tmp_path / "out", ["md"])
    page = (tmp_path / "out" / "report.md").read_text()
    assert f"run {rid}: candidates left out (evaluation not complete)" in page and note in page


def test_attempts_under_an_older_run_key_and_the_current_one_are_one_experiment(store):
    """Attempt 1 was recorded under the older key (it held the endpoint) and failed; after the
    upgrade, attempt 2 ran under the current key. One experiment: only attempt 2 is scored (two
    runs of one task would be an error)."""
    add_solutions(store)
    old = syn.add_run(store, "m", "none", "toy_softmax", [(1, (0.5, 2.0))], status="failed", rid="legacy-a1",
                      run_key="legacy", attempt=1)
    new = syn.add_run(store, "m", "none", "toy_softmax", [(1, (1.0, 4.0))], rid="current-a2", run_key="current",
                      attempt=2)
    data = load(store, Selection(guidance=["none"]))
    assert [r.run_id for r in data.runs] == [new]
    assert data.skipped == {old: f"attempt 1, superseded by {new}"}
    from d2kbench.report.build import score

    assert score(data, parse_baseline("reference")).runs[0].speedup == 1.0  # attempt 2's kernel


def test_a_campaign_counts_the_runs_of_its_experiments_filed_under_another_campaign(store):
    """Campaign "paper" ran m's unguided toy run; campaign "rerun" plans the same experiment (same
    task, model, backend, guidance, seed, budget), so its resume finds it done and never runs
    it again. Scored for "rerun", that run counts (speedup 1.0), not a missing task."""
    from d2kbench.campaign.plan import Plan
    from d2kbench.campaign.state import schedule
    from d2kbench.report.build import score

    add_solutions(store)
    plan = Plan(name="rerun", design="custom", guidance=["none"], tasks=["toy_softmax"],
                agents=[{"model": "m", "backend": "openai"}])
    (spec,) = plan.runs()
    store.record_plan("rerun", plan.model_dump(mode="json"))
    rid = syn.add_run(store, "m", "none", "toy_softmax", [(1, (1.0, 4.0))], campaign="paper", rid=f"{spec.key()}-a1",
                      run_key=spec.key())
    with store.conn:  # the identity of the recorded run: the plan's budget and wall clock
        store.conn.execute("UPDATE runs SET backend = 'openai', budget_turns = ?, config_json = ? WHERE run_id = ?",
                           (spec.budget_turns, json.dumps(spec.model_dump(mode="json")), rid))
    assert schedule(store, plan).done == [spec.key()]  # the resume of "rerun" will not run it
    data = load(store, Selection(campaigns=["rerun"]))
    assert [r.run_id for r in data.runs] == [rid] and data.borrowed == {rid: "paper"}
    g = score(data, parse_baseline("reference")).group("m", "none")
    assert (g.n_tasks, g.n_correct, g.missing, g.s_perf) == (1, 1, {}, 1.0)
