"""Whole runs of the built-in loop driven by the fake provider: one real end-to-end run through
the harness on the Muon task (an incorrect and a correct candidate), and cheap runs for retries,
malformed output, budget, wall clock, provider failures and leak screening."""

from __future__ import annotations

import json

import pytest

from agents_fakes.scripted import FAST_EVAL, TASK, builtin_script, correct_solution
from d2kbench.agents.backends import RetryPolicy, get_backend
from d2kbench.agents.fake_provider import FakeProvider
from d2kbench.agents.runner import RunSpec, run_agent, select_final
from d2kbench.store import Store

FAST = RetryPolicy(base_s=0.001, max_s=0.01, max_retries=3)


def _run(tmp_path, script, *, backend="openai", model="gpt-5", attempt=1, **spec):
    with FakeProvider(script) as fp:
        url = fp.base_url + ("/v1" if backend == "openai" else "")
        s = RunSpec(task=TASK, model=model, backend=backend, guidance=spec.pop("guidance", "L1+L2+L3"), base_url=url,
                    device="cpu", eval=FAST_EVAL, **{"budget_turns": 20, **spec})
        b = get_backend(backend, model, url, retry=FAST, api_key="test-key")
        out = run_agent(s, store_path=tmp_path / "s.sqlite", runs_root=tmp_path / "runs", attempt=attempt, backend=b)
        return out, Store(tmp_path / "s.sqlite"), fp


def _events(store, run_id, kind=None):
    return [(e["turn"], e["kind"], json.loads(e["data_json"])) for e in store.events_of(run_id, kind)]


def test_scripted_run_end_to_end_through_the_harness(tmp_path):
    out, store, fp = _run(tmp_path, builtin_script())
    rid = out.run_id
    run = store.run(rid)
    assert (run["status"], run["exit_reason"], run["error"]) == ("finished", "completed", None)
    # six model responses; the 429 and the 529 were retried inside and are not turns
    assert out.turns == 6 and len(fp.model_requests()) == 8
    turns = store.turns_of(rid)
    assert [t["turn"] for t in turns] == [1, 2, 3, 4, 5, 6]
    assert [t["retries"] for t in turns] == [0, 1, 0, 1, 0, 0]
    assert [e[2]["error"].split(":")[0] for e in _events(store, rid, "retry")] == ["429", "529"]
    # both submissions snapshotted and evaluated by the harness; the incorrect one first
    c1, c2 = store.candidates_of(rid)
    assert (c1["turn"], c1["eligible"], c1["status"], c1["note"]) == (3, 0, "evaluated", "first try")
    assert (c2["turn"], c2["eligible"], c2["status"]) == (5, 1, "evaluated") and c2["geomean_speedup"] > 0
    r1 = store.eval_rows([c1["eval_id"]])
    r2 = store.eval_rows([c2["eval_id"]])
    assert {(r["role"], r["status"]) for r in r1} == {("candidate", "incorrect"), ("baseline", "ok")}
    assert {(r["role"], r["status"]) for r in r2} == {("candidate", "ok"), ("baseline", "ok")}
    assert {r["solution_sha256"] for r in r2 if r["role"] == "candidate"} == {c2["solution_sha256"]}
    assert open(c2["path"]).read() == correct_solution()
    # the final answer: the eligible candidate with the highest geomean speedup
    assert run["final_candidate"] == c2["id"] == out.final_candidate
    assert out.final_speedup == pytest.approx(c2["geomean_speedup"])
    # the trajectory: messages, tool calls and results, candidate events, in order
    kinds = [k for _, k, _ in _events(store, rid)]
    assert kinds.count("tool_call") == 5 and kinds.count("tool_result") == 5 and kinds.count("candidate") == 2
    test_result = next(d for _, k, d in _events(store, rid, "tool_result") if d["name"] == "test")
    assert test_result["content"].startswith("SOME CHECKS FAILED")
    cand_events = [d for _, _, d in _events(store, rid, "candidate")]
    assert [(d["n"], d["eligible"]) for d in cand_events] == [(1, False), (2, True)]
    # usage and cost: hand-summed from the script; gpt-5 at $1.25 / $10 / $0.125 / $1.25 per M tokens
    # (Chat Completions reports one cache-write count, so turn 2's 1-hour write lands in cache_write_5m)
    sums = {k: sum(t[k] for t in turns) for k in ("input_tokens", "output_tokens", "cache_read", "cache_write_5m",
                                                   "cache_write_1h")}
    assert sums == {"input_tokens": 2500, "output_tokens": 2285, "cache_read": 15500, "cache_write_5m": 900,
                    "cache_write_1h": 0}
    assert sum(t["cost_usd"] for t in turns) == pytest.approx(0.0290375)
    assert run["cost_usd"] == pytest.approx(0.0290375) and out.cost_usd == pytest.approx(0.0290375)
    summary = json.loads(run["summary_json"])
    assert summary["usage"]["cache_read"] == 15500 and summary["eligible_candidates"] == 1
    assert summary["unpriced_models"] == []
    # the correct candidate is, token for token, the task's held-back straightforward solution
    (leak,) = [d for _, _, d in _events(store, rid, "leak_suspect")]
    assert leak == {"candidate_id": c2["id"], "n": 2, "copy_of": ["straightforward.py"]}
    assert summary["leak_suspects"] == 1


def test_anthropic_run_prices_cache_lifetimes_apart(tmp_path):
    u = {"input_tokens": 100, "output_tokens": 50, "cache_read": 1000, "cache_write_5m": 400, "cache_write_1h": 200}
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}], "usage": u},
              {"text": "nothing to do", "usage": u}]
    out, store, fp = _run(tmp_path, script, backend="anthropic", model="claude-sonnet-4-6", guidance="none")
    turns = store.turns_of(out.run_id)
    assert [(t["cache_write_5m"], t["cache_write_1h"]) for t in turns] == [(400, 200), (400, 200)]
    # per turn: 100*3 + 50*15 + 1000*0.3 + 400*3.75 + 200*6 = 4050 micro-dollars
    assert [t["cost_usd"] for t in turns] == [pytest.approx(0.00405)] * 2
    assert out.status == "finished" and out.final_candidate is None
    # the system prompt is the brief, with a cache breakpoint; the guidance level shows in it
    body = fp.model_requests()[0].body
    assert "NVIDIA H200" in body["system"][0]["text"] and "cache_control" in body["system"][0]
    assert "GUIDANCE.md" not in body["system"][0]["text"]
    ls = next(d for _, _, d in _events(store, out.run_id, "tool_result"))
    assert "solution.py" in ls["content"] and "expert.py" not in ls["content"]


def test_malformed_output_is_recorded_and_the_run_continues(tmp_path):
    script = [{"malformed": "body"},
              {"tool_calls": [{"name": "bash", "arguments": {"command": "echo hi"}}]},
              {"malformed": "empty"},
              {"malformed": "tool_arguments", "tool_calls": [{"name": "bash", "arguments": {"command": "echo x"}}]},
              {"text": "done"}]
    out, store, _ = _run(tmp_path, script)
    assert (out.status, out.exit_reason, out.turns) == ("finished", "completed", 3)
    errors = [d for _, _, d in _events(store, out.run_id, "error")]
    assert [e["kind"] for e in errors] == ["malformed", "malformed"]
    assert "malformed Chat Completions reply" in errors[0]["message"]
    results = [d for _, _, d in _events(store, out.run_id, "tool_result")]
    assert results[0]["ok"] and "hi" in results[0]["content"]
    assert not results[1]["ok"] and "not valid JSON" in results[1]["content"]


def test_persistent_malformed_output_fails_the_run_cleanly(tmp_path):
    out, store, _ = _run(tmp_path, [{"text": "hi", "tool_calls": [{"name": "bash", "arguments": {"command": "true"}}]}]
                         + [{"malformed": "body"}] * 3)
    run = store.run(out.run_id)
    assert (run["status"], run["exit_reason"]) == ("failed", "provider_error")
    assert "3 malformed responses in a row" in run["error"]
    assert out.turns == 1 and len(store.turns_of(out.run_id)) == 1  # the good turn is kept


def test_provider_error_fails_the_run_and_keeps_what_was_recorded(tmp_path):
    script = [{"tool_calls": [{"name": "write_file", "arguments": {"path": "solution.py", "content": "x = 1\n"}}]},
              {"error": 401, "error_message": "invalid x-api-key"}]
    out, store, _ = _run(tmp_path, script)
    run = store.run(out.run_id)
    assert (run["status"], run["exit_reason"]) == ("failed", "provider_error") and "invalid x-api-key" in run["error"]
    assert len(store.turns_of(out.run_id)) == 1
    assert any(d["status"] == 401 for _, _, d in _events(store, out.run_id, "error"))


def test_turn_budget_and_wall_clock_are_enforced_by_the_harness(tmp_path):
    forever = [{"tool_calls": [{"name": "bash", "arguments": {"command": "true"}}]}] * 10
    out, store, fp = _run(tmp_path / "a", forever, budget_turns=3)
    assert (out.status, out.exit_reason, out.turns) == ("finished", "budget", 3)
    assert len(fp.model_requests()) == 3
    slow = [{"tool_calls": [{"name": "bash", "arguments": {"command": "true"}}], "delay_s": 0.6}] * 10
    out, store, _ = _run(tmp_path / "b", slow, wall_clock_s=0.5)
    assert (out.status, out.exit_reason, out.turns) == ("finished", "timeout", 1)
    assert "wall-clock" in store.run(out.run_id)["error"]


def test_tool_calls_reaching_for_held_back_files_are_flagged(tmp_path):
    script = [{"tool_calls": [{"name": "bash", "arguments": {
        "command": "find / -name expert.py 2>/dev/null | head -1"}}]},
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "../../rubric.yaml"}}]},
        {"text": "ok"}]
    out, store, _ = _run(tmp_path, script)
    leaks = [d for _, _, d in _events(store, out.run_id, "leak_suspect")]
    assert [leak["name"] for leak in leaks] == ["bash", "read_file"]
    assert json.loads(store.run(out.run_id)["summary_json"])["leak_suspects"] == 2
    res = [d for _, _, d in _events(store, out.run_id, "tool_result")]
    assert "outside the workspace" in res[1]["content"]


def test_unknown_task_or_backend_fails_cleanly(tmp_path):
    with pytest.raises(ValueError, match="unknown backend"):
        RunSpec(task=TASK, model="m", backend="gemini", guidance="none")
    with pytest.raises(ValueError, match="unknown guidance level"):
        RunSpec(task=TASK, model="m", backend="openai", guidance="L3")
    spec = RunSpec(task="no_such_task", model="m", backend="openai", guidance="none", base_url="http://127.0.0.1:9/v1")
    out = run_agent(spec, store_path=tmp_path / "s.sqlite", runs_root=tmp_path / "runs")
    run = Store(tmp_path / "s.sqlite").run(out.run_id)
    assert (run["status"], run["exit_reason"]) == ("failed", "harness_error") and "no such task" in run["error"]


def test_selection_prefers_speed_then_earlier_turn():
    rows = [{"id": 1, "turn": 2, "eligible": 1, "geomean_speedup": 1.5, "status": "evaluated"},
            {"id": 2, "turn": 3, "eligible": 0, "geomean_speedup": None, "status": "evaluated"},
            {"id": 3, "turn": 4, "eligible": 1, "geomean_speedup": 2.0, "status": "evaluated"},
            {"id": 4, "turn": 6, "eligible": 1, "geomean_speedup": 2.0, "status": "evaluated"},
            {"id": 5, "turn": 7, "eligible": 1, "geomean_speedup": 9.0, "status": "rejected"}]
    assert select_final(rows)["id"] == 3
    assert select_final(rows[1:2]) is None
