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
    assert "│ all models (geomean) │ none     │ -     │ -       │ -         │ 0.595  │" in res.output
    assert "│ model-d              │ none     │ 2     │ 0       │ 2         │ 0.500  │" in res.output
    sheet = json.loads((tmp_path / "s.json").read_text())
    assert {g["guidance"] for g in sheet["groups"]} == {"none"}
    assert sheet["groups"][0]["s_perf"] == pytest.approx(2.5 ** 0.5)


def test_score_missing_baseline_is_an_error_unless_counted_as_failed(store_path):
    res = invoke("score", "--store", str(store_path), "--baseline", "model:model-b")
    assert res.exit_code == 2
    assert "no baseline for task 'muon_newton_schulz'" in res.output and "--missing-baseline fail" in res.output
    res = invoke("score", "--store", str(store_path), "--baseline", "model:model-b", "--missing-baseline", "fail")
    assert res.exit_code == 0, res.output
    assert ("no baseline, counted as failed muon_newton_schulz: run model-b.none.muon_newton_schulz (model-b, none) "
            "has no correct" in res.output)
    # model-c unguided: toy 1.0 / 0.05 = 20x against model-b's toy kernel, Muon counted as failed
    assert "│ model-c              │ none     │ 2     │ 1       │ 1         │ 3.162  │" in res.output


def test_score_warns_of_an_unpriced_model(store_path):
    res = invoke("score", "--store", str(store_path), "--guidance", "L1+L2+L3")
    assert res.exit_code == 0, res.output
    assert "warning: cost unknown: no price for model-d" in " ".join(res.output.split())
    usage_row = next(line for line in res.output.splitlines() if line.startswith("│ model-d") and "3,600" in line)
    assert usage_row.split("│")[-2].strip() == "unknown"  # the cost column: never $0


@pytest.mark.parametrize("args, message", [
    (["--baseline", "fastest"], "unknown baseline 'fastest'"),
    (["--missing-baseline", "exclude"], "--missing-baseline must be one of error, fail"),
])
def test_score_bad_options(store_path, args, message):
    res = invoke("score", "--store", str(store_path), *args)
    assert message in res.output
    assert res.exit_code == 2


def test_score_on_another_machine_counts_every_declared_task_as_failed(store_path):
    res = invoke("score", "--store", str(store_path), "--hardware", "B200", "--guidance", "none")
    assert res.exit_code == 0, res.output
    assert "left out: model-a.none.muon_newton_schulz (evaluated on H200)" in res.output
    assert "│ model-a              │ none     │ 2     │ 0       │ 2         │ 0.500  │" in res.output


def test_missing_store(tmp_path):
    res = invoke("score", "--store", str(tmp_path / "none.sqlite"))
    assert res.exit_code == 2 and "no results store at" in res.output
    assert not (tmp_path / "none.sqlite").exists()  # reading never creates a store


def test_report_writes_the_requested_formats(store_path, tmp_path):
    out = tmp_path / "rep"
    res = invoke("report", "--store", str(store_path), "--out", str(out), "-f", "md", "-f", "csv")
    assert res.exit_code == 0, res.output
    assert "runs: 19, tasks: 2, hardware: H200" in res.output
    assert (out / "report.md").is_file() and (out / "tasks" / "toy_softmax.md").is_file()
    assert (out / "tables" / "table5_fast_p.csv").is_file() and not (out / "report.html").exists()
    assert not (out / "figures").exists()
    assert "![" not in (out / "report.md").read_text()  # no links to figures that were not drawn
    res = invoke("report", "--store", str(store_path), "--out", str(out), "-f", "pdf")
    assert res.exit_code == 2 and "unknown format(s) pdf" in res.output
