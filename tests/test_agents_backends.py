"""Backends against the fake provider: wire formats, streaming, usage buckets, retries and
malformed output, for Chat Completions, Responses and Anthropic Messages."""

from __future__ import annotations

import json

import pytest
from agents_fakes.fake_provider import FakeProvider, load_script
from pydantic import ValidationError

from d2kbench.agents.backends import BackendError, MalformedOutputError, RetryPolicy, get_backend

FAST = RetryPolicy(base_s=0.001, max_s=0.01, max_retries=3)
TOOLS = [{"name": "run_tests", "description": "run the tests",
          "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}
API_VARIANTS = [("openai", {}), ("openai", {"stream": True}), ("openai", {"api": "responses"}),
                ("openai", {"api": "responses", "stream": True}), ("anthropic", {}), ("anthropic", {"stream": True})]
IDS = ["chat", "chat-sse", "responses", "responses-sse", "messages", "messages-sse"]


def _backend(fp: FakeProvider, name: str, opts: dict, **kw):
    url = fp.base_url + ("/v1" if name == "openai" else "")
    return get_backend(name, "fake-model", url, retry=FAST, api_key="test-key", **opts, **kw)


@pytest.mark.parametrize("name,opts", API_VARIANTS, ids=IDS)
def test_conversation_usage_tool_calls_and_structured_output(name, opts):
    usage = {"input_tokens": 10, "output_tokens": 5, "cache_read": 100, "cache_write_5m": 20, "cache_write_1h": 3}
    steps = [{"text": "hi", "usage": usage},
             {"text": "calling", "tool_calls": [{"name": "run_tests", "arguments": {"x": 1}}]},
             {"text": "ok"},
             {"json": {"a": 3}}]
    with FakeProvider(steps) as fp:
        b = _backend(fp, name, opts)
        msgs = [{"role": "user", "content": "hello"}]
        c = b.complete(msgs, system="be brief")
        assert c.text == "hi" and c.tool_calls == [] and c.retries == 0
        assert (c.usage.input_tokens, c.usage.output_tokens, c.usage.cache_read) == (10, 5, 100)
        if name == "anthropic":  # Messages reports the two cache-write lifetimes apart
            assert (c.usage.cache_write_5m, c.usage.cache_write_1h) == (20, 3)
        else:  # OpenAI APIs report one cache-write count; uncached input excludes every cache bucket
            assert (c.usage.cache_write_5m, c.usage.cache_write_1h) == (23, 0)
        msgs += [c.message(), {"role": "user", "content": "go"}]
        c = b.complete(msgs, tools=TOOLS)
        assert [(t.name, t.arguments) for t in c.tool_calls] == [("run_tests", {"x": 1})]
        call_id = c.tool_calls[0].id
        msgs += [c.message(), {"role": "tool", "tool_call_id": call_id, "content": "3 passed"}]
        c = b.complete(msgs, tools=TOOLS)
        assert c.text == "ok"
        c = b.complete([{"role": "user", "content": "answer in JSON"}], json_schema=SCHEMA)
        assert c.parsed == {"a": 3} and json.loads(c.text) == {"a": 3}
        reqs = fp.model_requests()
        assert len(reqs) == 4 and all(r.stream == bool(opts.get("stream")) for r in reqs)
        third = reqs[2].body
        if name == "anthropic":  # the tool result went back as a tool_result block, with cache markers
            last = third["messages"][-1]["content"][-1]
            assert last["type"] == "tool_result" and last["tool_use_id"] == call_id and last["content"] == "3 passed"
            assert last["cache_control"] == {"type": "ephemeral"}
            assert reqs[0].body["system"] == [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}]
            assert third["tools"][-1]["cache_control"] == {"type": "ephemeral"}
            assert third["messages"][1]["content"][0] == {"type": "text", "text": "hi"}  # assistant echoed verbatim
        elif opts.get("api") == "responses":
            assert third["input"][-1] == {"type": "function_call_output", "call_id": call_id, "output": "3 passed"}
            assert third["store"] is False and reqs[0].body["instructions"] == "be brief"
            assert any(i.get("type") == "function_call" and i.get("call_id") == call_id for i in third["input"])
        else:
            assert third["messages"][-1] == {"role": "tool", "tool_call_id": call_id, "content": "3 passed"}
            assert reqs[0].body["messages"][0] == {"role": "system", "content": "be brief"}


@pytest.mark.parametrize("name,opts", API_VARIANTS, ids=IDS)
def test_429_and_529_are_retried_and_reported(name, opts):
    with FakeProvider([{"error": 429, "retry_after": 0.01}, {"error": 529}, {"error": 503}, {"text": "hi"}]) as fp:
        seen = []
        b = _backend(fp, name, opts, on_retry=lambda a, msg, d: seen.append(msg))
        c = b.complete([{"role": "user", "content": "x"}])
        assert c.text == "hi" and c.retries == 3
        assert [e.split(":")[0] for e in c.retry_errors] == ["429", "529", "503"]
        assert len(seen) == 3 and len(fp.requests) == 4


@pytest.mark.parametrize("name,opts", [API_VARIANTS[0], API_VARIANTS[4]], ids=["chat", "messages"])
def test_retries_exhausted_and_non_retryable_errors(name, opts):
    with FakeProvider([{"error": 529}] * 4 + [{"error": 400, "error_message": "bad request: max_tokens"}]) as fp:
        b = _backend(fp, name, opts)
        with pytest.raises(BackendError) as e:
            b.complete([{"role": "user", "content": "x"}])
        assert e.value.retryable and e.value.status == 529 and "4 attempts" in str(e.value)
        with pytest.raises(BackendError) as e:
            b.complete([{"role": "user", "content": "x"}])
        assert not e.value.retryable and e.value.status == 400 and "max_tokens" in str(e.value)
        assert len(fp.requests) == 5  # a 400 is not retried


@pytest.mark.parametrize("name,opts", API_VARIANTS, ids=IDS)
def test_malformed_bodies_raise_a_clear_error(name, opts):
    with FakeProvider([{"malformed": "empty"}, {"malformed": "body"}]) as fp:
        b = _backend(fp, name, opts)
        for _ in range(2):
            with pytest.raises(MalformedOutputError, match="malformed|without|not valid"):
                b.complete([{"role": "user", "content": "x"}])


@pytest.mark.parametrize("name,opts", [API_VARIANTS[0], API_VARIANTS[1], API_VARIANTS[2], API_VARIANTS[4]],
                         ids=["chat", "chat-sse", "responses", "messages"])
def test_tool_call_with_non_json_arguments_is_kept_with_an_error(name, opts):
    with FakeProvider([{"malformed": "tool_arguments", "tool_calls": [{"name": "run_tests", "arguments": {"x": 1}}]}]) as fp:
        c = _backend(fp, name, opts).complete([{"role": "user", "content": "x"}], tools=TOOLS)
        (tc,) = c.tool_calls
        assert tc.name == "run_tests" and tc.arguments == {} and "not valid JSON" in tc.arguments_error
        assert tc.raw_arguments


def test_models_outside_the_script_get_filler_and_consume_nothing():
    with FakeProvider({"models": ["main"], "steps": [{"text": "scripted"}]}) as fp:
        small = get_backend("anthropic", "small-model", fp.base_url, retry=FAST, api_key="k")
        main = get_backend("anthropic", "main", fp.base_url, retry=FAST, api_key="k")
        assert small.complete([{"role": "user", "content": "title?"}]).text == "ok"
        assert main.complete([{"role": "user", "content": "x"}]).text == "scripted"
        assert main.complete([{"role": "user", "content": "x"}]).text == "Done."  # exhausted
        assert [r.step for r in fp.requests] == [None, 0, None]


def test_bad_names_options_and_scripts_fail_clearly(monkeypatch):
    with pytest.raises(ValueError, match="unknown backend 'gemini'"):
        get_backend("gemini", "m")
    with pytest.raises(ValueError, match="unknown OpenAI api"):
        get_backend("openai", "m", "http://127.0.0.1:9/v1", api="completions")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(BackendError, match="OPENAI_API_KEY") as e:
        get_backend("openai", "m")
    assert e.value.kind == "config"
    with pytest.raises(ValidationError, match="error"):
        load_script([{"error": 200}])
    with pytest.raises(ValidationError, match="malformed"):
        load_script([{"malformed": "sometimes"}])
    with pytest.raises(ValidationError, match="extra"):
        load_script({"steps": [], "bogus": 1})


def test_cli_backends_refuse_tools_and_missing_binaries(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    for name, binary in (("claude-code", "claude"), ("codex", "codex")):
        with pytest.raises(BackendError, match=f"needs the '{binary}' CLI") as e:
            get_backend(name, "m")
        assert e.value.kind == "config"
    b = get_backend("claude-code", "m", binary="/bin/true")
    with pytest.raises(ValueError, match="runs its own tools"):
        b.complete([{"role": "user", "content": "x"}], tools=TOOLS)


def test_claude_codes_tool_timeout_outlasts_the_longest_submit(tmp_path):
    """A submit waits up to the workspace's ``submit_timeout_s`` for its evaluation, then
    answers: Claude Code must let a Bash or MCP tool call run longer than that, and never move
    it to the background."""
    from d2kbench.agents.backends.claude_code import ClaudeCodeBackend
    from d2kbench.agents.workspace import WorkspaceConfig

    backend = object.__new__(ClaudeCodeBackend)  # the environment, without the CLI installed
    backend.api_key, backend.base_url, backend.extra_env = "k", None, {}
    env = backend.env(tmp_path)
    longest_submit_ms = WorkspaceConfig(task="t", guidance="none", run_dir=str(tmp_path)).submit_timeout_s * 1000
    for key in ("BASH_DEFAULT_TIMEOUT_MS", "BASH_MAX_TIMEOUT_MS", "MCP_TOOL_TIMEOUT"):
        assert int(env[key]) >= longest_submit_ms + 60_000, key
    assert env["CLAUDE_CODE_DISABLE_BACKGROUND_TASKS"] == "1"
