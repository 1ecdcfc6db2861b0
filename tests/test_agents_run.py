"""Whole runs of the built-in loop driven by the fake provider: one real end-to-end run through
the harness on the Muon task (an incorrect and a correct candidate), and cheap runs for retries,
malformed output, budget, wall clock, provider failures and leak screening."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agents_fakes.fake_provider import FakeProvider
from agents_fakes.scripted import FAST_EVAL, TASK, builtin_script, correct_solution

from d2kbench.agents.backends import RetryPolicy, get_backend
from d2kbench.agents.runner import RunSpec, run_agent
from d2kbench.store import Store
from d2kbench.tasks import load_task

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


@pytest.mark.slow
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
    assert Path(c2["path"]).read_text() == correct_solution()
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
    # the correct candidate is the agent's own: no copy of held-back code
    assert _events(store, rid, "leak_suspect") == [] and summary["leak_suspects"] == 0


@pytest.mark.slow
def test_a_candidate_that_copies_a_held_back_solution_is_excluded(tmp_path):
    """The task's straightforward solution with its names changed: recorded, marked, never
    eligible, so the final answer is the agent's own candidate, and reports name it."""
    from d2kbench.report.data import load

    held_back = (load_task(TASK).root / "solutions" / "straightforward.py").read_text()
    copy = held_back.replace("polar_express", "my_iteration")
    script = builtin_script()
    writes = [st for st in script["steps"] if "tool_calls" in st and st["tool_calls"][0]["name"] == "write_file"]
    writes[0]["tool_calls"][0]["arguments"]["content"] = correct_solution()
    writes[1]["tool_calls"][0]["arguments"]["content"] = copy
    out, store, _fp = _run(tmp_path, script)
    c1, c2 = store.candidates_of(out.run_id)
    assert (c1["status"], c1["eligible"]) == ("evaluated", 1)
    assert (c2["status"], c2["eligible"]) == ("held_back_copy", 0)
    (leak,) = [d for _, _, d in _events(store, out.run_id, "leak_suspect")]
    assert leak["candidate_id"] == c2["id"] and leak["copy_of"][0]["file"] == "straightforward.py"
    assert out.final_candidate == c1["id"]  # the copy was faster to write, not eligible
    assert load(store).held_back_copies == {out.run_id: [c2["id"]]}
    # every report says so: d2k score and the report's header
    from typer.testing import CliRunner

    from d2kbench.cli import app

    res = CliRunner().invoke(app, ["score", "--store", str(tmp_path / "s.sqlite"), "--missing-baseline", "fail"],
                             env={"COLUMNS": "200"})
    assert f"excluded: run {out.run_id} candidates #{c2['id']} (copies of held-back solutions)" in res.output, \
        res.output
    from d2kbench.report import build
    from d2kbench.scoring.baseline import parse_baseline

    data = load(store)
    header = build._header(data, build.score(data, parse_baseline("reference"), "fail"))
    assert any("copies of held-back solutions" in line and f"#{c2['id']}" in line for line in header)


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


def test_the_agents_bash_sees_its_workspace_and_nothing_of_the_suite_or_the_store(tmp_path):
    """Inside the agent's sandbox the expert, the rubric, other tasks, the store and the project
    are simply not there; the workspace's tools still answer (through the runner)."""
    from d2kbench.sandbox import bwrap
    from d2kbench.tasks.loader import SUITE_DIR

    if not bwrap.status().active:
        pytest.skip(f"no OS sandbox here: {bwrap.status().reason}")
    expert = SUITE_DIR / TASK / "solutions" / "expert.py"
    probe = (f"cat {expert} | head -c 80; echo; ls {SUITE_DIR}; echo; ls {tmp_path}; echo; "
             f"ls {SUITE_DIR.parents[2]} | head -3; echo; tools/test | head -1")
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": probe}}]}, {"text": "done"}]
    out, store, _ = _run(tmp_path, script, guidance="none")
    (res,) = [d for _, _, d in _events(store, out.run_id, "tool_result")]
    text = res["content"]
    assert "No such file or directory" in text and "import" not in text.split("\n")[1]
    assert "muon_newton_schulz" not in text.split(str(SUITE_DIR))[-1].split("\n")[1]  # the suite folder is empty
    assert "s.sqlite" not in text and "runs" not in text.split("\n")[3]
    assert "SOME CHECKS FAILED" in text or "ALL CHECKS PASSED" in text  # the test tool reached the runner


def test_unknown_task_or_backend_fails_cleanly(tmp_path):
    with pytest.raises(ValueError, match="unknown backend"):
        RunSpec(task=TASK, model="m", backend="gemini", guidance="none")
    with pytest.raises(ValueError, match="unknown guidance level"):
        RunSpec(task=TASK, model="m", backend="openai", guidance="L3")
    spec = RunSpec(task="no_such_task", model="m", backend="openai", guidance="none", base_url="http://127.0.0.1:9/v1")
    out = run_agent(spec, store_path=tmp_path / "s.sqlite", runs_root=tmp_path / "runs")
    run = Store(tmp_path / "s.sqlite").run(out.run_id)
    assert (run["status"], run["exit_reason"]) == ("failed", "harness_error") and "no such task" in run["error"]


def test_the_runner_records_the_scoring_rules_final_candidate(tmp_path):
    """The runner's final candidate comes from the scoring rule (lowest geomean latency), not
    from the speedups each evaluation measured against its own re-timed baseline."""
    import synthetic_store as syn

    from d2kbench.agents.runner import record_final

    store = Store(tmp_path / "s.sqlite")
    # own-evaluation speedups 1.30 and 1.28 (noisy re-timed baselines), latencies 1.00 vs 0.98 ms
    rid = syn.add_run(store, "m", "none", "toy_softmax", [(1, (1.0, 1.0)), (2, (0.98, 0.98)), (3, syn.FAIL)])
    store.conn.execute("UPDATE candidates SET geomean_speedup = CASE turn WHEN 1 THEN 1.30 WHEN 2 THEN 1.28 END "
                       "WHERE run_id = ?", (rid,))
    store.conn.commit()
    final, why = record_final(store, rid)
    assert why is None and (final["turn"], final["geomean_speedup"]) == (2, 1.28)
    empty = syn.add_run(store, "m", "L1", "toy_softmax", [(1, syn.FAIL)])
    assert record_final(store, empty) == (None, None)
    store.close()


def test_run_identity_is_the_experiment_not_the_endpoint():
    base = dict(task=TASK, model="m", backend="openai", guidance="none", seed=0, budget_turns=10)
    a = RunSpec(**base, base_url="http://127.0.0.1:1/v1", backend_options={"api_key": "sk-old"})
    moved = RunSpec(**base, base_url="http://127.0.0.1:2/v1", backend_options={"api_key": "sk-rotated"})
    assert a.key() == moved.key()  # a moved endpoint or a rotated key resumes, it does not restart
    for field, value in (("seed", 1), ("budget_turns", 11), ("guidance", "L1"), ("model", "m2"),
                         ("backend", "anthropic"), ("task", "paged_decode_gqa")):
        assert RunSpec(**{**base, field: value}).key() != a.key(), field
    assert a.legacy_key() != moved.legacy_key() and a.keys() == [a.key(), a.legacy_key()]


def test_a_resume_recognises_attempts_recorded_under_the_older_key(tmp_path):
    from d2kbench.campaign.plan import Plan
    from d2kbench.campaign.state import schedule

    plan = Plan(name="c", tasks=[TASK], agents=[{"model": "m", "backend": "openai", "base_url": "http://x/v1"}])
    spec = plan.runs()[0]
    store = Store(tmp_path / "s.sqlite")
    old = spec.legacy_key()
    store.start_run(f"{old}-a1", task=TASK, model="m", backend="openai", guidance=spec.guidance, seed=0,
                    budget_turns=spec.budget_turns, config={}, run_key=old)
    store.finish_run(f"{old}-a1", status="finished")
    sched = schedule(store, plan)
    assert old in sched.done or spec.key() in sched.done
    assert [s.guidance for s, _ in sched.todo] == ["L1+L2+L3"]  # only the run not yet done
    store.close()


def test_an_unpriced_model_costs_unknown_not_zero(tmp_path):
    from d2kbench.agents.backends.base import Usage
    from d2kbench.agents.pricing import load_prices
    from d2kbench.agents.recording import RunRecorder

    store = Store(tmp_path / "s.sqlite")
    store.start_run("r", task=TASK, model="m", backend="openai", guidance="none", seed=0, budget_turns=3, config={})
    prices = load_prices()
    priced = next(iter(prices.models))
    rec = RunRecorder(store, "r", prices)
    assert rec.turn(1, Usage(input_tokens=1000, output_tokens=100), priced) > 0
    assert rec.turn(2, Usage(input_tokens=1000, output_tokens=100), "no-such-model-anywhere") is None
    rec.finalize_totals()
    assert rec.cost_usd is None and rec.unpriced == {"no-such-model-anywhere"}
    rows = store.turns_of("r")
    assert [(r["turn"], r["unpriced"]) for r in rows] == [(1, 0), (2, 1)]
    store.close()


def test_d2k_run_warns_of_an_unpriced_model_and_keeps_its_key_out_of_the_store(tmp_path):
    """`d2k run` of a model the price table does not know: the cost column says unknown (never
    0.0000) with a warning; the API key given as a backend option, which the model's reply
    repeats, is in no record of the store."""
    from typer.testing import CliRunner

    from d2kbench.cli import app

    key = "sk-cli-option-0123456789"
    script = [{"text": f"Nothing to do. (my key is {key})", "usage": {"input_tokens": 100, "output_tokens": 10}}]
    with FakeProvider(script) as fp:
        res = CliRunner().invoke(app, ["run", TASK, "--model", "no-such-model-anywhere", "--backend", "openai",
                                       "--base-url", fp.base_url + "/v1", "--device", "cpu", "--budget-turns", "2",
                                       "--option", f"api_key={key}", "--store", str(tmp_path / "s.sqlite"),
                                       "--runs-dir", str(tmp_path / "runs")], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "warning: cost unknown: no price for no-such-model-anywhere" in text
    row = next(line for line in res.output.splitlines() if "finished" in line and "│" in line)
    assert [c.strip() for c in row.split("│")][-3] == "unknown"  # the cost $ column
    assert key.encode() not in (tmp_path / "s.sqlite").read_bytes()
    store = Store(tmp_path / "s.sqlite")
    (run,) = store.runs_of()
    assert json.loads(run["config_json"])["backend_options"]["api_key"] == "<redacted>" and run["cost_usd"] is None
    assert "<redacted>" in json.loads(run["summary_json"])["final_text"]
    store.close()


def test_a_moved_endpoint_and_a_rotated_key_resume_instead_of_restarting(tmp_path):
    """A paired campaign ran its unguided run to the end and was killed during the guided one;
    the endpoint then moved and the key was rotated. The resume keeps the finished run and starts
    only the guided run again, as its attempt 2."""
    from d2kbench.campaign.plan import Plan
    from d2kbench.campaign.state import schedule

    def plan(url, key):
        return Plan(name="c", tasks=[TASK], agents=[{"model": "m", "backend": "openai", "base_url": url,
                                                       "options": {"api_key": key, "reasoning_effort": "high"}}])

    before = plan("http://10.0.0.1:8000/v1", "sk-before-rotation-1")
    unguided, guided = before.runs()
    store = Store(tmp_path / "s.sqlite")
    for spec, status in ((unguided, "finished"), (guided, None)):
        store.start_run(f"{spec.key()}-a1", task=TASK, model="m", backend="openai", guidance=spec.guidance, seed=0,
                        budget_turns=spec.budget_turns, config=spec.model_dump(mode="json"), run_key=spec.key())
        if status:
            store.finish_run(f"{spec.key()}-a1", status=status)
    after = plan("http://10.0.0.2:9000/v1", "sk-after-rotation-2")
    sched = schedule(store, after)
    assert sched.done == [unguided.key()] and sched.interrupted == [f"{guided.key()}-a1"]
    assert [(s.guidance, attempt) for s, attempt in sched.todo] == [("L1+L2+L3", 2)]
    assert sched.todo[0][0].base_url == "http://10.0.0.2:9000/v1"  # it runs on the new endpoint
    assert b"sk-before-rotation-1" not in (tmp_path / "s.sqlite").read_bytes()
    store.close()


def test_a_design_runs_identity_is_the_experiment_too():
    from d2kbench.judge.design_run import DesignRunSpec

    a = DesignRunSpec(task=TASK, model="m", backend="openai", base_url="http://a/v1", backend_options={"api_key": "x"})
    b = DesignRunSpec(task=TASK, model="m", backend="openai", base_url="http://b/v1", backend_options={"api_key": "y"})
    assert a.key() == b.key() and a.keys()[1] != b.keys()[1]  # the older identity held the endpoint
    assert DesignRunSpec(task=TASK, model="m", backend="openai", seed=1).key() != a.key()
