"""``d2k judge impl``, ``d2k judge design`` and ``d2k design`` through typer's runner with the
fake provider; bad input exits 2 with a message naming the cause."""

from __future__ import annotations

import json

from agents_fakes.fake_provider import FakeProvider
from test_judge_support import design_fixture, expert_verdict, zero_verdict
from typer.testing import CliRunner

from d2kbench.cli import app
from d2kbench.store import Store

runner = CliRunner()
ENV = {"COLUMNS": "220"}


def judge_args(fp: FakeProvider, store) -> list[str]:
    return ["--backend", "openai", "--model", "fake-judge", "--base-url", fp.base_url + "/v1", "--store", str(store)]


def test_judge_impl_solution_twice_and_with_samples(tmp_path):
    store = tmp_path / "s.sqlite"
    with FakeProvider({"steps": [{"json": expert_verdict()}, {"json": zero_verdict()}]}) as fp:
        r = runner.invoke(app, ["judge", "impl", "expert", "--task", "muon_newton_schulz", *judge_args(fp, store),
                                "--json", str(tmp_path / "v.json")], env=ENV)
        assert r.exit_code == 0, r.output
        assert "q_composition, fixed_restart" in r.output and "85.0" in r.output
        r2 = runner.invoke(app, ["judge", "impl", "expert", "--task", "muon_newton_schulz", *judge_args(fp, store),
                                 "--samples", "2"], env=ENV)
        assert r2.exit_code == 0, r2.output
        assert "(cached)" in r2.output and "2 samples" in r2.output and len(fp.model_requests()) == 2
    data = json.loads((tmp_path / "v.json").read_text())
    assert data["stats"]["JS"]["median"] == 85.0 and data["records"][0]["judge"]["model"] == "fake-judge"


def test_judge_impl_bad_input(tmp_path):
    store = tmp_path / "s.sqlite"
    Store(store).close()
    r = runner.invoke(app, ["judge", "impl", "no-such-run", "-b", "openai", "-m", "x", "--store", str(store)], env=ENV)
    assert r.exit_code == 2 and "no run 'no-such-run'" in r.output
    r = runner.invoke(app, ["judge", "impl", "run-x", "-b", "openai", "-m", "x", "--store", str(tmp_path / "none.db")],
                      env=ENV)
    assert r.exit_code == 2 and "no results store at" in r.output
    src = tmp_path / "cand.py"
    src.write_text("x = 1\n")
    r = runner.invoke(app, ["judge", "impl", str(src), "-b", "openai", "-m", "x", "--store", str(store)], env=ENV)
    assert r.exit_code == 2 and "pass --task TASK" in r.output
    r = runner.invoke(app, ["judge", "impl", "nosuch", "--task", "muon_newton_schulz", "-b", "openai", "-m", "x",
                            "--store", str(store)], env=ENV)
    assert r.exit_code == 2 and "no run 'nosuch'" in r.output


def test_judge_impl_malformed_verdict_exits_1(tmp_path):
    with FakeProvider({"steps": [{"json": {"L1": 5}}, {"json": {"score": 3}}]}) as fp:
        r = runner.invoke(app, ["judge", "impl", "straightforward", "--task", "muon_newton_schulz",
                                *judge_args(fp, tmp_path / "s.sqlite")], env=ENV)
    assert r.exit_code == 1 and "no valid impl verdict after the repair round" in r.output
    assert "/L2: Field required" in r.output


def test_judge_design_file_and_schema_errors(tmp_path):
    good = tmp_path / "model_design.json"
    good.write_text(json.dumps(design_fixture()))
    bad = tmp_path / "bad.json"
    broken = design_fixture()
    broken["L2"][0].pop("ownership")
    bad.write_text(json.dumps(broken))
    with FakeProvider({"steps": [{"json": zero_verdict()}]}) as fp:
        r = runner.invoke(app, ["judge", "design", str(good), *judge_args(fp, tmp_path / "s.sqlite")], env=ENV)
        assert r.exit_code == 0, r.output
        r = runner.invoke(app, ["judge", "design", str(bad), *judge_args(fp, tmp_path / "s.sqlite")], env=ENV)
    assert r.exit_code == 2 and "not a valid model_design.json" in r.output and "/L2/0/ownership: Field required" \
        in r.output


def test_design_command(tmp_path):
    steps = [{"tool_calls": [{"name": "submit_design", "arguments": design_fixture()}]}]
    with FakeProvider({"steps": steps}) as fp:
        r = runner.invoke(app, ["design", "muon_newton_schulz", "--model", "fake-agent", "--backend", "openai",
                                "--base-url", fp.base_url + "/v1", "--store", str(tmp_path / "s.sqlite"),
                                "--runs-dir", str(tmp_path / "runs")], env=ENV)
    assert r.exit_code == 0, r.output
    assert "completed" in r.output and "model_design.json" in r.output
    r = runner.invoke(app, ["design", "muon_newton_schulz", "--model", "m", "--backend", "codex"], env=ENV)
    assert r.exit_code == 2 and "design runs need an API backend" in r.output
