"""Final-candidate selection, baselines as a parameter, and scores of run sets."""

from __future__ import annotations

import pytest

from d2kbench.scoring.baseline import BaselineSpec, parse_baseline, resolve_baseline
from d2kbench.scoring.metrics import MissingBaselineError, ScoringError
from d2kbench.scoring.records import CandidateRecord, RunRecord
from d2kbench.scoring.runs import TaskSet, group_score, score_run, score_runs
from d2kbench.scoring.selection import first_correct, select_final

BASE = {"a": 4.0, "b": 16.0}


def cand(cid: int, turn: int, lat: tuple[float, float] | None) -> CandidateRecord:
    if lat is None:
        return CandidateRecord(id=cid, turn=turn, eligible=False)
    return CandidateRecord(id=cid, turn=turn, eligible=True, latencies_ms={"a": lat[0], "b": lat[1]}, sha256=f"s{cid}")


def run(rid: str, task: str, model: str, guidance: str, cands: list[CandidateRecord], budget: int = 10) -> RunRecord:
    return RunRecord(run_id=rid, task=task, model=model, guidance=guidance, budget_turns=budget, candidates=cands)


def test_final_is_the_highest_geomean_among_eligible():
    cands = [
        cand(1, 1, (1.0, 1.0)),     # speedups 4, 16 -> 8, but ineligible below
        cand(2, 2, (2.0, 4.0)),     # 2, 4 -> sqrt(8)
        cand(3, 3, (1.0, 16.0)),    # 4, 1 -> 2
        cand(4, 4, (4.0, 2.0)),     # 1, 8 -> sqrt(8): ties with 2, later turn
    ]
    cands[0] = CandidateRecord(id=1, turn=1, eligible=False, latencies_ms={"a": 1.0, "b": 1.0})
    best, s = select_final(cands, BASE)
    assert best.id == 2 and s == pytest.approx(8 ** 0.5)
    # the best is not the last one, nor the best on a single workload (candidate 3 on a)
    assert select_final([cands[2]], BASE)[0].id == 3
    assert select_final([cands[0]], BASE) is None
    assert select_final([], BASE) is None


def test_selection_does_not_depend_on_the_baseline():
    cands = [cand(1, 1, (2.0, 4.0)), cand(2, 2, (1.0, 9.0)), cand(3, 3, (3.0, 2.0))]
    picks = {select_final(cands, base)[0].id for base in ({"a": 4.0, "b": 16.0}, {"a": 1.0, "b": 100.0},
                                                          {"a": 50.0, "b": 0.5})}
    assert picks == {3}  # lowest geometric-mean latency: sqrt(6) < sqrt(8) < sqrt(9)


def test_first_correct_is_the_earliest_eligible():
    cands = [cand(5, 7, (1.0, 1.0)), cand(2, 3, None), cand(9, 4, (8.0, 8.0)), cand(3, 4, (9.0, 9.0))]
    assert first_correct(cands).id == 3  # turn 4, lower id than 9; turn 3 was incorrect
    assert first_correct([cand(1, 1, None)]) is None


def test_parse_baseline_forms_and_errors():
    assert parse_baseline("expert") == BaselineSpec(kind="solution", name="expert")
    assert parse_baseline("run:r1") == BaselineSpec(kind="run", name="r1")
    assert parse_baseline("model:claude") == BaselineSpec(kind="model", name="claude")
    assert str(parse_baseline("model:claude")) == "model:claude"
    for bad in ("Expert", "model:", "run: ", "pytorch", ""):
        with pytest.raises(ValueError, match="unknown baseline"):
            parse_baseline(bad)


def test_model_baseline_is_that_models_first_correct_unguided_submission():
    runs = [
        run("u1", "t1", "base-model", "none", [cand(1, 2, None), cand(2, 5, (2.0, 8.0)), cand(3, 9, (1.0, 1.0))]),
        run("g1", "t1", "base-model", "L1+L2+L3", [cand(4, 1, (1.0, 1.0))]),
        run("u2", "t2", "base-model", "none", [cand(5, 1, None)]),
        run("x", "t1", "other", "none", [cand(6, 1, (9.0, 9.0))]),
    ]
    b = resolve_baseline(parse_baseline("model:base-model"), ["t1", "t2", "t3"], {}, runs)
    assert b.latencies_ms == {"t1": {"a": 2.0, "b": 8.0}}
    assert b.sources["t1"] == "run u1, candidate 2 (turn 5)"
    assert "has no correct submission" in b.missing["t2"]
    assert "no unguided run" in b.missing["t3"]
    # so the baseline model's first correct submission scores exactly 1.0 against itself
    first_only = run("u1", "t1", "base-model", "none", [cand(2, 5, (2.0, 8.0))])
    assert score_run(first_only, b.latencies_ms["t1"]).speedup == 1.0
    with pytest.raises(ScoringError, match="2 unguided runs"):
        again = run("u1b", "t1", "base-model", "none", [])
        resolve_baseline(parse_baseline("model:base-model"), ["t1"], {}, [*runs, again])


def test_run_and_solution_baselines():
    runs = [run("r1", "t1", "m", "none", [cand(1, 3, (2.0, 2.0))])]
    b = resolve_baseline(parse_baseline("run:r1"), ["t1", "t2"], {}, runs)
    assert b.latencies_ms == {"t1": {"a": 2.0, "b": 2.0}} and "of task 't1'" in b.missing["t2"]
    with pytest.raises(ScoringError, match="baseline run 'nope' is not in the store"):
        resolve_baseline(parse_baseline("run:nope"), ["t1"], {}, runs)
    sols = {"t1": {"expert": {"a": 1.0, "b": 2.0}, "reference": {"a": 3.0}}}
    b = resolve_baseline(parse_baseline("expert"), ["t1", "t2"], sols, [])
    assert b.latencies_ms == {"t1": {"a": 1.0, "b": 2.0}}
    assert b.missing == {"t2": "no recorded timings of the expert solution on this hardware"}


def test_score_runs_penalises_failures_and_handles_missing_baselines():
    runs = [
        run("1", "t1", "m", "none", [cand(1, 1, (1.0, 4.0))]),   # speedups 4, 4 -> 4
        run("2", "t2", "m", "none", [cand(2, 1, None)]),          # failed -> 0.5
        run("3", "t3", "m", "none", [cand(3, 1, (4.0, 16.0))]),  # t3 has no baseline
        run("d", "t1", "m", "design", []),                         # independent design: never scored
    ]
    tasks = TaskSet(default=["t1", "t2", "t3"], source="test")
    base = resolve_baseline(parse_baseline("reference"), ["t1", "t2", "t3"],
                            {"t1": {"reference": BASE}, "t2": {"reference": BASE}}, [])
    with pytest.raises(MissingBaselineError, match="task 't3': no recorded timings of the reference") as e:
        score_runs(runs, base, tasks)
    assert set(e.value.missing) == {"t3"}
    sheet = score_runs(runs, base, tasks, missing="fail")
    assert sheet.no_baseline == {"t3": "no recorded timings of the reference solution on this hardware"}
    g = sheet.group("m", "none")
    # t3 is declared: without a baseline it counts as failed, it does not leave the denominator
    assert g.tasks == ["t1", "t2", "t3"] and g.n_correct == 1 and g.missing == {"t3": "no baseline"}
    assert g.s_perf == pytest.approx((4.0 * 0.5 * 0.5) ** (1 / 3))
    assert g.fast_p == {1.0: 1 / 3, 1.5: 1 / 3, 2.0: 1 / 3}
    assert g.geomean_speedup is None  # not every task correct
    assert sheet.group("m", "design") is None
    with pytest.raises(ScoringError, match="'error' or 'fail'"):
        score_runs(runs, base, tasks, missing="skip")


def test_an_eligible_candidate_off_the_baseline_workloads_is_an_error():
    odd = CandidateRecord(id=1, turn=1, eligible=True, latencies_ms={"a": 1.0})
    with pytest.raises(ScoringError, match="candidate has no latency for workload\\(s\\) b"):
        score_run(run("r", "t", "m", "none", [odd]), BASE)


def test_group_score_rejects_two_runs_of_one_task():
    base = BASE
    rs = [score_run(run(r, "t1", "m", "none", [cand(1, 1, (1.0, 1.0))]), base) for r in ("r1", "r2")]
    with pytest.raises(ScoringError, match="task 't1' has more than one run \\(r1, r2\\)"):
        group_score("m", "none", rs, ["t1"])
    assert group_score("m", "none", rs[:1], ["t1"]).s_perf == pytest.approx(8.0)
    with pytest.raises(ScoringError, match="run r1 is of task 't1', which is not declared"):
        group_score("m", "none", rs[:1], ["t2"])


def test_overall_across_models():
    base = resolve_baseline(parse_baseline("reference"), ["t1"], {"t1": {"reference": BASE}}, [])
    runs = [run("1", "t1", "m1", "none", [cand(1, 1, (2.0, 8.0))]),      # 2
            run("2", "t1", "m2", "none", [cand(2, 1, (0.5, 2.0))]),      # 8
            run("3", "t1", "m2", "L1", [cand(3, 1, (4.0, 16.0))])]       # 1
    sheet = score_runs(runs, base, TaskSet(default=["t1"], source="test"))
    assert sheet.overall("none") == pytest.approx(4.0)
    assert sheet.overall("L1") == 1.0
    assert sheet.overall("L1+L2") is None
