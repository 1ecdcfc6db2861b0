"""``d2k score`` and ``d2k report`` through the real CLI app."""

from __future__ import annotations

import json

import pytest
import synthetic_store as syn
from typer.testing import CliRunner

from d2kbench.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    return syn.build(tmp_path_factory.mktemp("cli") / "golden.sqlite")


def invoke(*args):
    return runner.invoke(app, list(args), env={"COLUMNS": "200"})


def test_score_prints_and_writes_json(store_path, tmp_path):
    res = invoke("score", "--store", str(store_path), "--guidance", "none", "--json", str(tmp_path / "s.json"))
    assert res.exit_code == 0, res.output
    assert "hardware H200; baseline: the task's `reference` solution" in res.output
    assert "│ all models (geomean) │ none     │ -     │ -       │ 0.630  │" in res.output
    sheet = json.loads((tmp_path / "s.json").read_text())
    assert {g["guidance"] for g in sheet["groups"]} == {"none"}
    assert sheet["groups"][0]["s_perf"] == pytest.approx(2.5 ** 0.5)


def test_score_missing_baseline_is_an_error_unless_excluded(store_path):
    res = invoke("score", "--store", str(store_path), "--baseline", "model:model-b")
    assert res.exit_code == 2
    assert "no baseline for task 'muon_newton_schulz'" in res.output and "--missing-baseline exclude" in res.output
    res = invoke("score", "--store", str(store_path), "--baseline", "model:model-b", "--missing-baseline", "exclude")
    assert res.exit_code == 0, res.output
    assert ("excluded muon_newton_schulz: run model-b.none.muon_newton_schulz (model-b, none) has no correct"
            in res.output)


@pytest.mark.parametrize("args, message", [
    (["--baseline", "fastest"], "unknown baseline 'fastest'"),
    (["--missing-baseline", "ignore"], "--missing-baseline must be one of error, exclude"),
    (["--hardware", "B200"], "no finished agent runs"),
])
def test_score_bad_options(store_path, args, message):
    res = invoke("score", "--store", str(store_path), *args)
    assert message in res.output
    assert res.exit_code == (0 if "no finished" in message else 2)


def test_missing_store(tmp_path):
    res = invoke("score", "--store", str(tmp_path / "none.sqlite"))
    assert res.exit_code == 2 and "no results store at" in res.output
    assert not (tmp_path / "none.sqlite").exists()  # reading never creates a store


def test_report_writes_the_requested_formats(store_path, tmp_path):
    out = tmp_path / "rep"
    res = invoke("report", "--store", str(store_path), "--out", str(out), "-f", "md", "-f", "csv")
    assert res.exit_code == 0, res.output
    assert "runs: 18, tasks: 2, hardware: H200" in res.output
    assert (out / "report.md").is_file() and (out / "tasks" / "toy_softmax.md").is_file()
    assert (out / "tables" / "table5_fast_p.csv").is_file() and not (out / "report.html").exists()
    assert not (out / "figures").exists()
    assert "![" not in (out / "report.md").read_text()  # no links to figures that were not drawn
    res = invoke("report", "--store", str(store_path), "--out", str(out), "-f", "pdf")
    assert res.exit_code == 2 and "unknown format(s) pdf" in res.output
