"""Paper tables on small sheets: incomplete selections are flagged, not silently mixed."""

from __future__ import annotations

import itertools
import sys

import pytest

from d2kbench.report import tables
from d2kbench.report.build import build_report
from d2kbench.report.data import ReportData, Selection
from d2kbench.scoring.baseline import parse_baseline, resolve_baseline
from d2kbench.scoring.records import CandidateRecord, RunRecord
from d2kbench.scoring.runs import score_runs

IDS = itertools.count(1)
BASE = {"t1": {"reference": {"w": 2.0}}, "t2": {"reference": {"w": 2.0}}}


def run(model, guidance, task, lat):
    cands = [] if lat is None else [CandidateRecord(id=next(IDS), turn=1, eligible=True,
                                                    latencies_ms={"w": lat})]
    return RunRecord(run_id=f"{model}/{guidance}/{task}", task=task, model=model, guidance=guidance, budget_turns=2,
                     candidates=cands)


def sheet_of(runs):
    return score_runs(runs, resolve_baseline(parse_baseline("reference"), ["t1", "t2"], BASE, []))


def test_table1_flags_models_with_runs_for_only_some_tasks():
    sheet = sheet_of([run("a", "none", "t1", 1.0), run("a", "none", "t2", 1.0), run("b", "none", "t1", 0.5)])
    t = tables.table1(sheet)
    assert [r[0] for r in t.rows] == ["a", "b", "all models"]
    assert t.rows[1][1] == 1 and t.rows[1][5] == 4.0  # b: one task, S_perf over it only
    assert any("b / none (1 of 2)" in n for n in t.notes)
    complete = tables.table1(sheet_of([run("a", "none", "t1", 1.0), run("a", "none", "t2", 1.0)]))
    assert not any("only some tasks" in n for n in complete.notes)


def test_table4_lists_only_models_fully_correct_in_both_settings():
    sheet = sheet_of([run("a", "none", "t1", 1.0), run("a", "L1+L2+L3", "t1", 0.5),
                      run("b", "none", "t1", 1.0), run("b", "L1+L2+L3", "t1", None)])
    t = tables.table4(sheet)
    assert [r[0] for r in t.rows] == ["a", "1 fully-correct model(s)"]
    assert t.rows[0][2:] == [2.0, 4.0, 1.0]
    none = tables.table4(sheet_of([run("b", "none", "t1", None), run("b", "L1+L2+L3", "t1", 1.0)]))
    assert none.rows == [] and none.notes == ["no model is correct on every task in both settings."]


def test_png_without_matplotlib_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    data = ReportData(store="s", hardware="cpu", selection=Selection(), tasks=[], runs=[], pool=[])
    with pytest.raises(ValueError, match="need matplotlib"):
        build_report(data, parse_baseline("reference"), tmp_path, ["png"])
    assert build_report(data, parse_baseline("reference"), tmp_path, ["md"]) == [tmp_path / "report.md"]
