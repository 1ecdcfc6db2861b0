"""The real Claude Code and Codex CLIs, scripted by the fake provider, through whole runs:
tools over MCP and as workspace commands, a submission evaluated by the harness, per-turn
usage (Claude's repeated message ids deduplicated, Codex's cumulative totals de-accumulated),
cost, and the turn budget enforced by killing the process group.

CI installs the CLIs with ``bash .ci/install-agent-clis.sh``; locally, a test whose CLI is not
on PATH is skipped with that reason.
"""

from __future__ import annotations

import json
import shutil

import pytest
from agents_fakes.fake_provider import FakeProvider
from agents_fakes.scripted import FAST_EVAL, TASK, claude_script, codex_script, correct_solution

from d2kbench.agents.runner import RunSpec, run_agent
from d2kbench.store import Store

needs_claude = pytest.mark.skipif(shutil.which("claude") is None,
                                  reason="the claude CLI is not installed (bash .ci/install-agent-clis.sh)")
needs_codex = pytest.mark.skipif(shutil.which("codex") is None,
                                 reason="the codex CLI is not installed (bash .ci/install-agent-clis.sh)")


def _run(tmp_path, backend: str, model: str, script: dict, **spec):
    with FakeProvider(script) as fp:
        url = fp.base_url + ("/v1" if backend == "codex" else "")
        s = RunSpec(task=TASK, model=model, backend=backend, guidance=spec.pop("guidance", "L1"), base_url=url,
                    device="cpu", eval=FAST_EVAL, wall_clock_s=spec.pop("wall_clock_s", 240),
                    budget_turns=spec.pop("budget_turns", 20), backend_options={"timeout_s": 240}, **spec)
        out = run_agent(s, store_path=tmp_path / "s.sqlite", runs_root=tmp_path / "runs")
        return out, Store(tmp_path / "s.sqlite"), fp


def _events(store, rid, kind):
    return [json.loads(e["data_json"]) for e in store.events_of(rid, kind)]


@needs_claude
@pytest.mark.slow
def test_claude_code_scripted_run(tmp_path):
    out, store, fp = _run(tmp_path, "claude-code", "claude-sonnet-4-6", claude_script())
    run = store.run(out.run_id)
    assert (run["status"], run["exit_reason"]) == ("finished", "completed"), run["error"]
    # four model responses, each counted once although the stream repeats message ids; the 529
    # the CLI retried is not a turn
    turns = store.turns_of(out.run_id)
    assert [t["turn"] for t in turns] == [1, 2, 3, 4]
    assert [r.status for r in fp.model_requests()] == [200, 529, 200, 200, 200]
    # final output counts come from the session file, not the stream's partial ones
    assert [(t["input_tokens"], t["output_tokens"], t["cache_read"], t["cache_write_5m"], t["cache_write_1h"])
            for t in turns] == [(3000, 2100, 0, 9000, 0), (200, 30, 12000, 0, 500), (300, 40, 12500, 0, 0),
                                (100, 12, 13000, 0, 0)]
    # ours: sum over turns of 3/15/0.30/3.75/6 $ per M tokens; Claude Code's own figure sits beside it
    ours = (3600 * 3 + 2182 * 15 + 37500 * 0.30 + 9000 * 3.75 + 500 * 6) / 1e6
    assert run["cost_usd"] == pytest.approx(ours)
    assert run["cli_cost_usd"] is not None and turns[-1]["cli_cost_usd"] == run["cli_cost_usd"]
    assert run["cli_cost_usd"] == pytest.approx(ours, rel=0.02)
    # the MCP test tool ran through the harness; the submission came from the workspace command
    results = _events(store, out.run_id, "tool_result")
    assert any("ALL CHECKS PASSED" in r["content"] for r in results)
    (cand,) = store.candidates_of(out.run_id)
    assert cand["eligible"] == 1 and cand["turn"] == 3 and cand["note"] == "via-cli"
    assert open(cand["path"]).read() == correct_solution()
    assert run["final_candidate"] == cand["id"]
    session = _events(store, out.run_id, "session")[0]
    assert {"mcp__d2k__submit", "mcp__d2k__test"} <= set(session["tools"]) and "WebSearch" not in session["tools"]
    # the brief went in as CLAUDE.md; the CLI ran in the workspace with a private config dir
    body = fp.model_requests()[0].body
    assert "NVIDIA H200" in json.dumps(body) and "GUIDANCE.md" in json.dumps(body)


@needs_codex
@pytest.mark.slow
def test_codex_scripted_run(tmp_path):
    out, store, fp = _run(tmp_path, "codex", "gpt-5.5", codex_script())
    run = store.run(out.run_id)
    assert (run["status"], run["exit_reason"]) == ("finished", "completed"), run["error"]
    turns = store.turns_of(out.run_id)
    assert [t["turn"] for t in turns] == [1, 2, 3, 4]
    assert [r.status for r in fp.model_requests()] == [200, 500, 200, 200, 200]
    # per-call usage from cumulative totals (input excludes the cached part)
    assert [(t["input_tokens"], t["output_tokens"], t["cache_read"]) for t in turns] == [
        (2000, 2100, 0), (500, 20, 4000), (400, 30, 4600), (100, 10, 5200)]
    ours = (3000 * 5.00 + 2160 * 30.00 + 13800 * 0.50) / 1e6
    assert run["cost_usd"] == pytest.approx(ours) and run["cli_cost_usd"] is None  # Codex reports no cost
    summary = json.loads(run["summary_json"])
    assert summary["cli_reported_usage"]["input_tokens"] == 3000  # the cumulative total, as a cross-check
    (cand,) = store.candidates_of(out.run_id)
    assert cand["eligible"] == 1 and cand["note"] == "via-mcp" and 1 <= cand["turn"] <= 4
    results = _events(store, out.run_id, "tool_result")
    assert any("ALL CHECKS PASSED" in r["content"] for r in results)
    calls = _events(store, out.run_id, "tool_call")
    assert [c["name"] for c in calls] == ["shell", "shell", "mcp__d2k__submit"]
    assert "AGENTS.md" in json.dumps(fp.model_requests()[0].body) or "NVIDIA H200" in json.dumps(
        fp.model_requests()[0].body)


def _forever(tool: dict, model: str) -> dict:
    return {"models": [model], "steps": [{"tool_calls": [tool]}] * 2 + [{"tool_calls": [tool], "delay_s": 5}] * 5}


@needs_claude
def test_claude_code_is_stopped_at_the_turn_budget(tmp_path):
    script = _forever({"name": "Bash", "arguments": {"command": "echo again", "description": "echo"}},
                      "claude-sonnet-4-6")
    out, store, _ = _run(tmp_path, "claude-code", "claude-sonnet-4-6", script, budget_turns=2)
    run = store.run(out.run_id)
    assert (run["status"], run["exit_reason"], out.turns) == ("finished", "budget", 2)
    assert "turn budget of 2" in run["error"]


@needs_codex
def test_codex_is_stopped_at_the_turn_budget(tmp_path):
    script = _forever({"name": "exec_command", "arguments": {"cmd": "echo again"}}, "gpt-5.5")
    out, store, _ = _run(tmp_path, "codex", "gpt-5.5", script, budget_turns=2)
    run = store.run(out.run_id)
    assert (run["status"], run["exit_reason"], out.turns) == ("finished", "budget", 2)


@needs_claude
def test_a_hanging_cli_is_killed_at_the_wall_clock_limit(tmp_path):
    script = {"models": ["claude-sonnet-4-6"], "steps": [{"text": "thinking...", "delay_s": 60}]}
    out, store, _ = _run(tmp_path, "claude-code", "claude-sonnet-4-6", script, wall_clock_s=8)
    run = store.run(out.run_id)
    assert (run["status"], run["exit_reason"]) == ("finished", "timeout") and "wall-clock" in run["error"]
