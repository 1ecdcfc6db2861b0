"""Independent design runs against the fake provider: schema errors go back to the agent as
the tool result, a valid design ends the run, and the run is stored with guidance 'design'."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from agents_fakes.fake_provider import FakeProvider
from test_judge_support import PROPERTIES, design_fixture, level, quote, verdict

from d2kbench.judge.design_run import DesignRunSpec, run_design, submit_tool
from d2kbench.judge.runner import JudgeConfig, judge
from d2kbench.judge.targets import TargetError, design_from_run, impl_from_run
from d2kbench.store import Store

TASK = "muon_newton_schulz"


def invalid_design() -> dict:
    d = copy.deepcopy(design_fixture())
    del d["L3"][0]["pitfalls"]
    d["L1"][0]["conditions"] = []
    return d


def script(*designs, text_first: bool = False) -> dict:
    steps = [{"text": "Let me think about the Gram matrix first."}] if text_first else []
    steps += [{"text": "Submitting.", "tool_calls": [{"name": "submit_design", "arguments": d}],
               "usage": {"input_tokens": 9000, "output_tokens": 1500}} for d in designs]
    return {"models": ["fake-agent"], "steps": steps}


@pytest.mark.parametrize("api", ["chat", "anthropic"])
def test_invalid_then_valid_submission(tmp_path, api):
    store_path = tmp_path / "d.sqlite"
    with FakeProvider(script(invalid_design(), design_fixture(), text_first=True)) as fp:
        spec = DesignRunSpec(task=TASK, model="fake-agent", backend="openai" if api == "chat" else "anthropic",
                             base_url=fp.base_url + ("/v1" if api == "chat" else ""), budget_turns=5)
        out = run_design(spec, store_path=store_path, runs_root=tmp_path / "runs")
        reqs = fp.model_requests()
    assert (out.status, out.exit_reason, out.turns, out.submissions, out.accepted) == ("finished", "completed", 3, 2,
                                                                                       True)
    # the agent saw only the shared files, no guidance, no template, and one tool
    first = json.dumps(reqs[0].body)
    assert "task.yaml" in first and "requirements.md" in first and "reference.py" in first
    assert "Compose the polynomial steps" not in first and "raise NotImplementedError" not in first
    tools = reqs[0].body["tools"]
    names = [t.get("name") or t["function"]["name"] for t in tools]
    assert names == ["submit_design"]
    # turn 2 got the nudge, turn 3 the schema errors as the tool result
    second, third = json.dumps(reqs[1].body), json.dumps(reqs[2].body)
    assert "You have not submitted a design yet" in second
    assert "The design was NOT accepted: 2 problems" in third
    assert "/L3/0/pitfalls: Field required" in third and "/L1/0/conditions: List should have at least 1 item" in third
    assert out.design_path and json.loads(Path(out.design_path).read_text()) == design_fixture()
    store = Store(store_path)
    run = store.run(out.run_id)
    assert (run["guidance"], run["status"], run["model"], run["final_candidate"]) == ("design", "finished",
                                                                                     "fake-agent", None)
    summary = json.loads(run["summary_json"])
    assert summary["design"] == design_fixture() and summary["rejected_submissions"] == 1
    kinds = [e["kind"] for e in store.events_of(out.run_id)]
    assert "design_rejected" in kinds and kinds.index("design_rejected") < kinds.index("design_accepted")
    assert [t["input_tokens"] for t in store.turns_of(out.run_id)][1:] == [9000, 9000]
    store.close()


def test_budget_exhausted_then_judged_zero_without_a_call(tmp_path):
    store_path = tmp_path / "d.sqlite"
    with FakeProvider(script(invalid_design(), invalid_design(), design_fixture())) as fp:
        spec = DesignRunSpec(task=TASK, model="fake-agent", backend="openai", base_url=fp.base_url + "/v1",
                             budget_turns=2)
        out = run_design(spec, store_path=store_path, runs_root=tmp_path / "runs")
        assert len(fp.model_requests()) == 2, "the harness enforces the budget"
    assert (out.status, out.exit_reason, out.accepted) == ("finished", "budget", False)
    store = Store(store_path)
    subject = design_from_run(store, out.run_id)
    assert subject.design is None and "without an accepted design" in subject.reason
    with FakeProvider({"steps": []}) as judge_fp:
        rec = judge(subject, JudgeConfig(backend="openai", model="j", base_url=judge_fp.base_url + "/v1"), store=store)
        assert judge_fp.requests == []
    assert rec.status == "no_design" and rec.js == 0
    with pytest.raises(TargetError, match="is an independent design run"):
        impl_from_run(store, out.run_id)
    store.close()


def test_design_run_is_judged_by_run_id(tmp_path):
    store_path = tmp_path / "d.sqlite"
    with FakeProvider(script(design_fixture())) as fp:
        out = run_design(DesignRunSpec(task=TASK, model="fake-agent", backend="openai", base_url=fp.base_url + "/v1"),
                         store_path=store_path, runs_root=tmp_path / "runs")
    store = Store(store_path)
    subject = design_from_run(store, out.run_id[:10])
    v = verdict(level([quote("apply Q to X once per segment", "q_composition")], ["q_composition"],
                      ["fixed_restart"], 50),
                level([], [], PROPERTIES["L2"], 0), level([], [], PROPERTIES["L3"], 0))
    with FakeProvider({"steps": [{"json": v}]}) as fp:
        rec = judge(subject, JudgeConfig(backend="openai", model="j", base_url=fp.base_url + "/v1"), store=store)
    assert rec.target == out.run_id and rec.js == pytest.approx(50 / 3)
    assert store.verdict_rows()[0]["target"] == out.run_id
    store.close()


def test_cli_backends_are_refused_and_the_tool_schema_is_the_design_schema():
    with pytest.raises(ValueError, match="design runs need an API backend"):
        DesignRunSpec(task=TASK, model="m", backend="codex")
    params = submit_tool()["parameters"]
    assert set(params["required"]) >= {"schema_version", "task", "L1", "L2", "L3", "dataflow"}
    assert "$ref" not in json.dumps(params)
