"""Scores that stay true when data is missing, with hand-computed values: declared tasks, the
one final-selection rule, paired token changes, judges never pooled, unknown costs."""

from __future__ import annotations

import pytest

from d2kbench.report import tables
from d2kbench.report.data import ReportData, Selection, Usage, Verdict
from d2kbench.scoring.baseline import parse_baseline, resolve_baseline
from d2kbench.scoring.records import CandidateRecord, RunRecord
from d2kbench.scoring.runs import LeftOut, TaskSet, score_runs
from d2kbench.scoring.selection import final_candidate, select_final
from d2kbench.scoring.trajectory import trajectory

TASKS = ["t1", "t2", "t3"]
BASE = {t: {"reference": {"w": 2.0}} for t in TASKS}


def cand(cid: int, turn: int, ms: float | None) -> CandidateRecord:
    return CandidateRecord(id=cid, turn=turn, eligible=ms is not None, latencies_ms={"w": ms} if ms else {},
                           sha256=f"sha{cid}")


def run(model, guidance, task, cands, rid=None, seed=0, budget=4) -> RunRecord:
    return RunRecord(run_id=rid or f"{model}/{guidance}/{task}", task=task, model=model, guidance=guidance,
                     candidates=cands, seed=seed, budget_turns=budget)


def sheet(runs, tasks=TASKS, left_out=(), missing="error"):
    base = resolve_baseline(parse_baseline("reference"), tasks, {t: BASE[t] for t in tasks if t in BASE}, [])
    return score_runs(runs, base, TaskSet(default=tasks, source="test"), missing, left_out)


def test_one_run_on_one_of_three_tasks_counts_the_other_two_as_failed():
    # 2x on t1 (2.0 ms baseline, 1.0 ms kernel); t2 and t3 have no run
    s = sheet([run("m", "none", "t1", [cand(1, 1, 1.0)])])
    g = s.group("m", "none")
    assert g.s_perf == pytest.approx((2.0 * 0.5 * 0.5) ** (1 / 3), rel=1e-12)  # 0.7937..., not 2.0
    assert round(g.s_perf, 3) == 0.794
    assert g.fast_p[1.0] == pytest.approx(1 / 3)  # not 1.0
    assert (g.n_tasks, g.n_correct, g.geomean_speedup) == (3, 1, None)
    assert g.missing == {"t2": "no run", "t3": "no run"}
    assert "m / none: 2 of 3 (2 no run)" in s.missing_note()


def test_reasons_of_missing_tasks_come_from_the_runs_left_out():
    left = [LeftOut(run_id="a1", task="t2", model="m", guidance="none", reason="interrupted"),
            LeftOut(run_id="a2", task="t2", model="m", guidance="none", reason="running"),
            LeftOut(run_id="b", task="t3", model="m", guidance="none", reason="evaluated on B200"),
            LeftOut(run_id="c", task="t1", model="m", guidance="none", reason="attempt 1, superseded by x",
                    superseded=True)]
    s = sheet([run("m", "none", "t1", [cand(1, 1, 1.0)])], left_out=left)
    assert s.group("m", "none").missing == {"t2": "running", "t3": "evaluated on B200"}  # the newest attempt's
    # a model with only left-out runs is still a scored group: every declared task failed
    s2 = sheet([], left_out=left)
    assert s2.group("m", "none").s_perf == 0.5 and s2.group("m", "none").n_correct == 0


def test_an_unbaselined_task_counts_as_failed_with_fail():
    runs = [run("m", "none", "t1", [cand(1, 1, 1.0)]), run("m", "none", "t2", [cand(2, 1, 0.5)])]
    base = resolve_baseline(parse_baseline("reference"), TASKS, {"t1": BASE["t1"]}, [])
    s = score_runs(runs, base, TaskSet(default=["t1", "t2"], source="test"), "fail")
    g = s.group("m", "none")
    assert g.missing == {"t2": "no baseline"} and g.s_perf == pytest.approx(1.0)  # sqrt(2 * 0.5)
    assert s.no_baseline == {"t2": "no recorded timings of the reference solution on this hardware"}


def test_the_trajectory_counts_a_missing_task_at_0_1_every_turn():
    s = sheet([run("m", "none", "t1", [cand(1, 2, 1.0)], budget=3)])
    g = s.group("m", "none")
    tr = trajectory([r for r in s.runs], [0, 1, 2, 3], g.tasks)
    # t1: 0.1, 0.1, 2, 2; t2 and t3: 0.1 throughout
    assert tr.values == pytest.approx([0.1, 0.1, (2 * 0.01) ** (1 / 3), (2 * 0.01) ** (1 / 3)], rel=1e-12)


def test_the_final_candidate_is_the_lowest_geomean_latency_not_the_own_evaluation_speedup():
    # own-evaluation speedups would say 1.30 (candidate 1) vs 1.28 (candidate 2); latencies 1.00 vs 0.98 ms
    cands = [cand(1, 1, 1.00), cand(2, 2, 0.98), cand(3, 3, None)]
    assert final_candidate(cands).id == 2
    chosen, speed = select_final(cands, {"w": 2.0})
    assert chosen.id == 2 and speed == pytest.approx(2.0 / 0.98)
    assert final_candidate([cand(4, 5, 1.0), cand(5, 3, 1.0)]).id == 5  # a tie: the earlier turn
    odd = CandidateRecord(id=6, turn=1, eligible=True, latencies_ms={"w": 1.0, "v": 1.0})
    with pytest.raises(ValueError, match="timed on different workloads"):
        final_candidate([cand(1, 1, 1.0), odd])


def _data(runs, usage, verdicts=()):
    return ReportData(store="s", hardware="H200", selection=Selection(), tasks=["t1", "t2"], runs=runs, pool=[],
                      usage=usage, verdicts=list(verdicts))


def test_table6b_compares_paired_runs_only():
    # model a: unguided 100 / guided 150 input tokens on t1 (+50%); model b has a guided run only
    # (400 tokens): the unpaired totals of Table 6 read (150 + 400) / 100 - 1 = +450%; paired: +50%
    runs = [run("a", "none", "t1", []), run("a", "L1+L2+L3", "t1", []), run("b", "L1+L2+L3", "t1", [])]
    usage = {"a/none/t1": Usage(runs=1, turns=1, input_tokens=100, output_tokens=10, cost_usd=1.0),
             "a/L1+L2+L3/t1": Usage(runs=1, turns=1, input_tokens=150, output_tokens=12, cost_usd=1.5),
             "b/L1+L2+L3/t1": Usage(runs=1, turns=1, input_tokens=400, output_tokens=90, cost_usd=None,
                                    unpriced_models=["b"])}
    t6, t6b = tables.table6(_data(runs, usage))
    assert t6b.rows == [[1, pytest.approx(0.5), pytest.approx(0.2), None, None, pytest.approx(0.5), 1]]
    assert "1 paired (model, task) run(s)" in t6b.notes[0] and "1 run(s) without a partner" in t6b.notes[0]
    totals = {r[1]: r for r in t6.rows if r[0] == "all models"}
    assert totals["L1+L2+L3"][3] / totals["none"][3] - 1 == pytest.approx(4.5)  # what an unpaired change reads
    assert totals["L1+L2+L3"][3] == 550 and totals["L1+L2+L3"][-1] == "unknown"  # never US$0 when unpriced
    assert any("no price for b" in n for n in t6.notes)


def test_table6b_cost_change_over_priced_pairs_only():
    runs = [run(m, g, "t1", []) for m in ("a", "b") for g in ("none", "L1+L2+L3")]
    usage = {"a/none/t1": Usage(runs=1, input_tokens=100, cost_usd=1.0),
             "a/L1+L2+L3/t1": Usage(runs=1, input_tokens=200, cost_usd=3.0),
             "b/none/t1": Usage(runs=1, input_tokens=100, cost_usd=None, unpriced_models=["b"]),
             "b/L1+L2+L3/t1": Usage(runs=1, input_tokens=100, cost_usd=None, unpriced_models=["b"])}
    _, t6b = tables.table6(_data(runs, usage))
    # tokens over both pairs: 300 / 200 - 1 = +50%; cost over a's pair only: 3 / 1 - 1 = +200%
    assert t6b.rows == [[2, pytest.approx(0.5), None, None, None, pytest.approx(2.0), 1]]
    assert "over the 1 pair(s) whose runs are all priced" in t6b.notes[1]


def _verdict(target, js, judge="j1", prompt="p1", rubric="r1", subject=""):
    return Verdict(kind="impl", task="t1", target=target, judge_model=judge, prompt_version=prompt,
                   rubric_version=rubric, candidate_sha256=subject, l1=js, l2=js, l3=js, js=js)


def test_table2_never_pools_judges_and_follows_the_final_candidate():
    runs = [run("m", "none", "t1", [cand(1, 1, 1.00), cand(2, 2, 0.98)]),
            run("m", "L1+L2+L3", "t1", [cand(3, 1, 0.5)])]
    s = sheet(runs, tasks=["t1"])
    verdicts = [_verdict("sha2", 40), _verdict("sha2", 60),                     # j1 on the final: median 50
                _verdict("sha2", 90, judge="j2"),                               # another judge: its own row
                _verdict("sha2", 10, prompt="p2"),                              # another prompt: its own row
                _verdict("sha2", 30, rubric="r2"),                              # another rubric: its own row
                _verdict("m/none/t1", 99, subject="sha1"),                      # judged candidate 1: not counted
                _verdict("sha3", 70)]
    t = tables.table2(s, _data(runs, {}, verdicts))
    rows = {r[0]: r for r in t.rows}
    assert set(rows) == {"j1; p1; r1", "j1; p2; r1", "j1; p1; r2", "j2; p1; r1"}
    assert rows["j1; p1; r1"][3:5] == [50.0, 70.0]  # (40 + 60) / 2 unguided, 70 guided; 99 left out
    assert rows["j2; p1; r1"][3:5] == [90.0, None] and rows["j1; p2; r1"][3] == 10.0
    assert rows["j1; p1; r2"][3:5] == [30.0, None]  # pooled with r1 the median would be 40, not 50 and 30
    assert any("4 judge configurations" in n for n in t.notes)
    assert any("judged another candidate than the final-selection rule's" in n for n in t.notes)


def test_table2_counts_a_missing_task_as_zero():
    runs = [run("m", "none", "t1", [cand(1, 1, 1.0)])]  # t2 declared, no run
    s = sheet(runs, tasks=["t1", "t2"])
    t = tables.table2(s, _data(runs, {}, [_verdict("sha1", 80)]))
    assert t.rows[0][3] == 40.0 and t.rows[0][-1] == "0/0 / 2/2 / 0/0"  # (80 + 0) / 2


def test_table1b_counts_a_declared_task_without_a_baseline_as_failed():
    """The expert is timed on t1, t2 and t3; the reference (the baseline) only on t1 and t2.
    S_perf of the expert over the 3 declared tasks: (2 x 4 x 0.5)^(1/3) = 4^(1/3) = 1.587, not
    sqrt(2 x 4) = 2.828 over the 2 baselined ones."""
    from d2kbench.report.data import SolutionTiming

    def timing(ms):
        return {"w": SolutionTiming(sha256="x", mean_ms=ms, n_ok=1, n_failed=0, last_status="ok")}

    solutions = {"t1": {"reference": timing(2.0), "expert": timing(1.0)},
                 "t2": {"reference": timing(2.0), "expert": timing(0.5)}, "t3": {"expert": timing(1.0)}}
    data = ReportData(store="s", hardware="H200", selection=Selection(), tasks=TASKS, runs=[], pool=[],
                      solutions=solutions)
    base = resolve_baseline(parse_baseline("reference"), TASKS, data.solution_ms(), [])
    s = score_runs([], base, TaskSet(default=TASKS, source="test"))
    t = tables.solutions_table(s, data)
    rows = {r[0]: r for r in t.rows}
    assert rows["expert"][1:] == [3, pytest.approx(2 / 3), pytest.approx(4 ** (1 / 3), rel=1e-12)]
    assert round(rows["expert"][3], 3) == 1.587
    assert rows["reference"][1:] == [3, pytest.approx(2 / 3), pytest.approx(0.5 ** (1 / 3), rel=1e-12)]
    assert "straightforward" not in rows  # timed nowhere: no row
    assert any("1 declared task(s) counted as failed in every row for lack of a baseline: t3 (no recorded "
               "timings of the reference solution on this hardware)" in n for n in t.notes)


def test_the_reports_trajectory_and_figures_count_missing_tasks(tmp_path, monkeypatch):
    """The report path: S'_perf of a model with a run on 1 of 3 tasks (2x from turn 2) is
    (2 x 0.1 x 0.1)^(1/3) = 0.271 at the end, and both figures carry a footnote saying how many
    tasks counted as failed and why."""
    from d2kbench.report import build, figures

    s = sheet([run("m", "none", "t1", [cand(1, 2, 1.0)], budget=3)],
              left_out=[LeftOut(run_id="x", task="t2", model="m", guidance="none", reason="interrupted")])
    series, overall = build.trajectories(s)
    assert series[("m", "none")].values == pytest.approx([0.1, 0.1, 0.02 ** (1 / 3), 0.02 ** (1 / 3)], rel=1e-12)
    assert round(overall["none"].final, 3) == 0.271
    notes = []
    monkeypatch.setattr(figures, "_save", lambda fig, path: (notes.append((path.name, fig.get_supxlabel())), path)[1])
    data = _data([run("m", "none", "t1", [cand(1, 2, 1.0)], budget=3)], {})
    build.build_pages(data, s, {}, True, tmp_path)
    summary = ("2 declared task(s) in 1 (model, guidance) group(s) counted as failed for lack of a scored result "
               "(1 interrupted, 1 no run); see the report's notes.")
    assert notes[:2] == [("fig3_ablation.png", summary), ("fig4_trajectory.png", summary)]
