"""Paper tables on small sheets: missing tasks count as failed and are named, unpaired runs and
other judges are never mixed in."""

from __future__ import annotations

import itertools
import sys

import pytest

from d2kbench.report import tables
from d2kbench.report.build import build_report
from d2kbench.report.data import ReportData, Selection
from d2kbench.scoring.baseline import parse_baseline, resolve_baseline
from d2kbench.scoring.records import CandidateRecord, RunRecord
from d2kbench.scoring.runs import LeftOut, TaskSet, score_runs

IDS = itertools.count(1)
BASE = {"t1": {"reference": {"w": 2.0}}, "t2": {"reference": {"w": 2.0}}}


def run(model, guidance, task, lat):
    cands = [] if lat is None else [CandidateRecord(id=next(IDS), turn=1, eligible=True,
                                                    latencies_ms={"w": lat})]
    return RunRecord(run_id=f"{model}/{guidance}/{task}", task=task, model=model, guidance=guidance, budget_turns=2,
                     candidates=cands)


def sheet_of(runs, left_out=()):
    return score_runs(runs, resolve_baseline(parse_baseline("reference"), ["t1", "t2"], BASE, []),
                      TaskSet(default=["t1", "t2"], source="test"), left_out=left_out)


def test_table1_counts_missing_tasks_as_failed_and_says_so():
    # b has one run (2x) of the two declared tasks; its t2 run is still running
    running = LeftOut(run_id="b/none/t2", task="t2", model="b", guidance="none", reason="running")
    sheet = sheet_of([run("a", "none", "t1", 1.0), run("a", "none", "t2", 1.0), run("b", "none", "t1", 1.0)],
                     [running])
    t = tables.table1(sheet)
    assert [r[0] for r in t.rows] == ["a", "b", "all models"]
    assert t.rows[1][1] == 2 and t.rows[1][3] == 0.5  # b: 2 declared tasks, 1 correct
    assert t.rows[1][5] == pytest.approx((2.0 * 0.5) ** 0.5)  # not 2.0: the running task counts 0.5
    assert any("b / none: 1 of 2 (1 running)" in n for n in t.notes)
    complete = tables.table1(sheet_of([run("a", "none", "t1", 1.0), run("a", "none", "t2", 1.0)]))
    assert not any("counted as failed" in n for n in complete.notes)


def test_table4_lists_only_models_fully_correct_in_both_settings():
    sheet = sheet_of([run("a", "none", "t1", 1.0), run("a", "L1+L2+L3", "t1", 0.5),
                      run("a", "none", "t2", 2.0), run("a", "L1+L2+L3", "t2", 2.0),
                      run("b", "none", "t1", 1.0), run("b", "L1+L2+L3", "t1", None),
                      run("c", "none", "t1", 1.0), run("c", "L1+L2+L3", "t1", 1.0)])
    t = tables.table4(sheet)
    assert [r[0] for r in t.rows] == ["a", "1 fully-correct model(s)"]
    assert t.rows[0][2:] == [pytest.approx(2 ** 0.5), 2.0, pytest.approx(2 ** 0.5 - 1)]  # sqrt(2*1), sqrt(4*1)
    # c is correct on every task it ran, but t2 is declared and missing in both settings
    assert "not fully correct because declared tasks have no scored result" in t.notes[0]
    assert "c (unguided: 1 no run; guided: 1 no run)" in t.notes[0]  # how many and why
    none = tables.table4(sheet_of([run("b", "none", "t1", None), run("b", "L1+L2+L3", "t1", 1.0)]))
    assert none.rows == [] and none.notes[0] == "no model is correct on every task in both settings."


def test_table5_denominator_is_the_declared_tasks():
    sheet = sheet_of([run("b", "none", "t1", 1.0)])  # 2x on t1, t2 missing
    t = tables.table5(sheet)
    assert t.rows == [["b", "none", 2, 0.5, 0.5, 0.0]]
    assert "b / none: 1 of 2 (1 no run)" in t.notes[0]


def test_png_without_matplotlib_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    data = ReportData(store="s", hardware="cpu", selection=Selection(), tasks=[], runs=[], pool=[])
    with pytest.raises(ValueError, match="need matplotlib"):
        build_report(data, parse_baseline("reference"), tmp_path, ["png"])
    assert build_report(data, parse_baseline("reference"), tmp_path, ["md"]) == [tmp_path / "report.md"]
