"""Token accounting: the price table, cost, and the CLI stream parsers' traps (Claude Code's
repeated message ids and partial output counts; Codex's cumulative totals)."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import pytest

from d2kbench.agents.backends.base import Usage
from d2kbench.agents.backends.claude_code import ClaudeStreamParser
from d2kbench.agents.backends.cli import SessionResult
from d2kbench.agents.backends.codex import CodexParser, codex_usage
from d2kbench.agents.pricing import PriceEntry, cost_usd, load_prices, price_turn

FIX = Path(__file__).parent / "agents_fakes" / "fixtures"
REPO_PRICES = Path(__file__).resolve().parents[1] / "prices.yaml"


def lines(name: str) -> list[dict]:
    return [json.loads(x) for x in (FIX / name).read_text().splitlines() if x.strip()]


# ---- prices -------------------------------------------------------------------------------------

def test_repo_price_table_is_dated_and_sourced():
    table = load_prices(REPO_PRICES)
    assert table.models, "prices.yaml has no models"
    for name, e in table.models.items():
        assert isinstance(e.as_of, dt.date) and e.as_of <= dt.date.today(), name
        assert e.source.startswith("https://"), name
        p = e.per_mtok
        if e.provider == "anthropic":  # the published multipliers of base input
            assert p.cache_read == pytest.approx(0.1 * p.input) and p.cache_write_5m == pytest.approx(1.25 * p.input)
            assert p.cache_write_1h == pytest.approx(2 * p.input)


def test_cost_is_the_sum_of_bucket_prices():
    e = load_prices(REPO_PRICES).models["claude-sonnet-4-6"]
    u = Usage(input_tokens=1270, output_tokens=77, cache_read=8800, cache_write_5m=3000, cache_write_1h=300)
    # 1270*3 + 77*15 + 8800*0.30 + 3000*3.75 + 300*6 = 20655 micro-dollars
    assert cost_usd(u, e) == pytest.approx(0.020655)
    assert cost_usd(Usage(), e) == 0.0


def test_model_lookup_aliases_dated_ids_and_unknown_models():
    table = load_prices(REPO_PRICES)
    assert table.lookup("anthropic/claude-sonnet-4-6")[0] == "claude-sonnet-4-6"
    assert table.lookup("claude-haiku-4-5-20251001")[0] == "claude-haiku-4-5"
    assert table.lookup("claude-sonnet-4-6-fast") is None
    assert price_turn(Usage(input_tokens=10), "no-such-model", table) is None
    assert price_turn(Usage(input_tokens=10), "gpt-5", None) is None


def test_long_context_multipliers_apply_per_request():
    e = PriceEntry.model_validate({"provider": "x", "per_mtok": {"input": 1, "output": 2, "cache_read": 0.1,
                                                                 "cache_write_5m": 1.25, "cache_write_1h": 2},
                                   "as_of": "2026-11-01", "source": "https://example.org/prices",
                                   "long_context": {"above_input_tokens": 1000, "input_multiplier": 2,
                                                    "output_multiplier": 1.5}})
    assert cost_usd(Usage(input_tokens=1000, output_tokens=10), e) == pytest.approx((1000 + 20) / 1e6)
    assert cost_usd(Usage(input_tokens=900, cache_read=200, output_tokens=10), e) == pytest.approx(
        (2 * (900 + 20) + 1.5 * 20) / 1e6)


def test_malformed_price_tables_name_the_problem(tmp_path):
    bad = tmp_path / "prices.yaml"
    bad.write_text("version: 2026-11-01\nmodels:\n  m:\n    provider: x\n    per_mtok: {input: 1}\n"
                   "    as_of: 2026-11-01\n    source: https://example.org\n")
    with pytest.raises(ValueError, match=r"models\.m\.per_mtok\.output"):
        load_prices(bad)
    bad.write_text("version: [")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_prices(bad)
    with pytest.raises(FileNotFoundError, match="D2K_PRICES"):
        load_prices(tmp_path / "missing.yaml")


# ---- Claude Code stream-json ------------------------------------------------------------------

def test_claude_stream_dedupes_message_ids_and_takes_final_usage_from_the_session(tmp_path):
    proj = tmp_path / "projects" / "-ws"
    proj.mkdir(parents=True)
    shutil.copy(FIX / "claude_session.jsonl", proj / "sess-1.jsonl")
    events, live = [], []
    p = ClaudeStreamParser(config_dir=tmp_path, on_turn=lambda t: live.append(t.index),
                           on_event=lambda k, d: events.append((k, d)))
    for obj in lines("claude_stream.jsonl"):
        p.feed(obj)
    # three API responses, though five assistant lines came
    assert [t.message_id for t in p.turns] == ["msg_A", "msg_B", "msg_C"] and live == [1, 2, 3]
    assert p.turns[0].usage.output_tokens == 40  # the stream's partial count, before reconciliation
    assert [tc.name for tc in p.turns[0].tool_calls] == ["mcp__d2k__test"]
    res = SessionResult()
    p.finish(res)
    total = Usage.total(t.usage for t in p.turns)
    assert (total.input_tokens, total.output_tokens, total.cache_read, total.cache_write_5m,
            total.cache_write_1h) == (1270, 77, 8800, 3000, 300)
    # the result line is a cross-check (equal to the per-message sum), never added on top
    assert res.reported_usage.output_tokens == total.output_tokens
    assert res.reported_usage.cache_write == total.cache_write
    assert res.cli_cost_usd == pytest.approx(0.0301)
    assert res.other_models == {"claude-haiku-4-5": Usage(input_tokens=500, output_tokens=20)}
    kinds = [k for k, _ in events]
    assert kinds.count("tool_call") == 2 and kinds.count("tool_result") == 2 and kinds[0] == "session"
    assert any(k == "tool_result" and d["is_error"] for k, d in events)
    assert p.error is None


def test_claude_stream_budget_stop_waits_for_the_last_turns_tool_results():
    p = ClaudeStreamParser()
    objs = lines("claude_stream.jsonl")
    for obj in objs[:4]:  # msg_A with its tool call, no result yet
        p.feed(obj)
    assert not p.should_stop(1)
    p.feed(objs[4])  # its tool result
    assert p.should_stop(1) and not p.should_stop(2)
    p.feed(objs[5])  # a second response beyond a budget of 1
    assert p.should_stop(1)


def test_claude_error_result_is_an_agent_error():
    p = ClaudeStreamParser()
    p.feed({"type": "result", "subtype": "error_max_turns", "is_error": True, "errors": ["max turns"]})
    assert p.error.startswith("error_max_turns")


# ---- Codex --------------------------------------------------------------------------------------

def test_codex_rollout_totals_become_per_call_deltas(tmp_path):
    roll = tmp_path / "sessions" / "2026" / "11" / "29" / "rollout-2026-11-29T00-00-00-t1.jsonl"
    roll.parent.mkdir(parents=True)
    raw = (FIX / "codex_rollout.jsonl").read_text().splitlines(keepends=True)
    turns = []
    p = CodexParser(tmp_path, on_turn=lambda t: turns.append(t))
    roll.write_text("".join(raw[:4]) + raw[4][:20])  # a partial last line is not read yet
    p.poll()
    assert len(turns) == 1  # the repeated report of the same totals is not a second call
    with open(roll, "a") as fh:
        fh.write(raw[4][20:] + "".join(raw[5:]))
    p.poll()
    assert [t.index for t in turns] == [1, 2, 3] and turns[0].model == "gpt-5.5"
    assert [(t.usage.input_tokens, t.usage.cache_read, t.usage.output_tokens, t.usage.reasoning_tokens)
            for t in turns] == [(1000, 0, 50, 10), (400, 900, 70, 20), (200, 1200, 30, 0)]
    for obj in lines("codex_events.jsonl"):
        p.feed(obj)
    res = SessionResult()
    p.finish(res)
    # the cumulative turn.completed equals the sum of the deltas
    assert res.reported_usage == Usage.total(t.usage for t in turns)
    assert p.final_text == "Submitted."
    assert codex_usage({"input_tokens": 10, "cached_input_tokens": 4, "output_tokens": 1}) == Usage(
        input_tokens=6, cache_read=4, output_tokens=1)


def test_codex_usage_records_are_one_per_response_id(tmp_path):
    roll = tmp_path / "sessions" / "2026" / "11" / "29" / "rollout-x.jsonl"
    roll.parent.mkdir(parents=True)
    shutil.copy(FIX / "codex_rollout_records.jsonl", roll)
    p = CodexParser(tmp_path)
    p.poll()
    # three responses; the repeated record and the late token_count totals add nothing
    assert [t.message_id for t in p.turns] == ["resp_1", "resp_2", "resp_3"]
    assert [(t.usage.input_tokens, t.usage.cache_read, t.usage.output_tokens) for t in p.turns] == [
        (2000, 0, 2100), (500, 4000, 20), (400, 4600, 30)]


def test_codex_items_become_tool_calls_and_results():
    events = []
    p = CodexParser(Path("/nonexistent"), on_event=lambda k, d: events.append((k, d)))
    for obj in lines("codex_events.jsonl"):
        p.feed(obj)
    calls = [d for k, d in events if k == "tool_call"]
    results = [d for k, d in events if k == "tool_result"]
    assert [c["name"] for c in calls] == ["shell", "mcp__d2k__submit"]
    assert calls[1]["arguments"] == {"note": "v1"}
    assert [r["is_error"] for r in results] == [True, False]
    assert not p.in_flight
    p.feed({"type": "turn.failed", "error": {"message": "stream disconnected"}})
    assert "stream disconnected" in p.error
