"""Anthropic Messages API backend through the official ``anthropic`` SDK, with prompt caching.

Cache breakpoints (``cache_control``) go on the last tool, the system prompt and the last
content block of the conversation, so the growing prefix is written once and read on every
later turn (at most 4 breakpoints are allowed; this uses 3).
"""

from __future__ import annotations

import json
import os
from typing import Any

from d2kbench.agents.backends.base import (
    RETRY_STATUSES,
    Backend,
    BackendError,
    Completion,
    MalformedOutputError,
    Usage,
    make_tool_call,
    parse_retry_after,
    with_retries,
)

# Imports inside functions: the anthropic SDK (an optional extra) loads only when this backend runs.

#: Name of the forced tool that carries a structured (``json_schema``) answer.
STRUCTURED_TOOL = "structured_output"


def _classify(e: BaseException):
    import anthropic

    if isinstance(e, anthropic.APIStatusError):
        return (e.status_code in RETRY_STATUSES, e.status_code, parse_retry_after(e.response.headers),
                str(e.message)[:300])
    if isinstance(e, (anthropic.APIConnectionError, anthropic.APITimeoutError)):
        return (True, None, None, str(e)[:300])
    return None


def _get(obj, key, default=0):
    if obj is None:
        return default
    v = obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)
    return default if v is None else v


def messages_usage(u, default_ttl: str = "5m") -> Usage:
    """Disjoint buckets from a Messages ``usage`` (``input_tokens`` already excludes cache).

    Cache writes are split by lifetime from ``cache_creation.ephemeral_5m/1h_input_tokens``;
    without that breakdown they count as ``default_ttl`` writes.
    """
    if u is None:
        return Usage()
    written = _get(u, "cache_creation_input_tokens")
    cc = _get(u, "cache_creation", None)
    if cc is not None:
        w5, w1 = _get(cc, "ephemeral_5m_input_tokens"), _get(cc, "ephemeral_1h_input_tokens")
        if w5 + w1 != written and written:
            w5 = written - w1
    else:
        w5, w1 = (0, written) if default_ttl == "1h" else (written, 0)
    return Usage(input_tokens=_get(u, "input_tokens"), output_tokens=_get(u, "output_tokens"),
                 cache_read=_get(u, "cache_read_input_tokens"), cache_write_5m=w5, cache_write_1h=w1)


class AnthropicBackend(Backend):
    """A Claude model behind the Messages API (or a compatible gateway / the fake provider).

    Options:
        api_key: default ``$ANTHROPIC_API_KEY`` (``$ANTHROPIC_AUTH_TOKEN`` is sent as a bearer
            token when set instead).
        cache: put prompt-cache breakpoints (default True); cache_ttl: ``5m`` or ``1h``.
        stream: use server-sent events (default False; needed for very long outputs).
        thinking_budget: extended-thinking budget in tokens (thinking blocks are echoed back).
        timeout_s: per request (default 600). temperature: when set.
        http_client: an ``httpx.Client``.
    """

    name = "anthropic"

    def __init__(self, model: str, base_url: str | None = None, *, api_key: str | None = None, cache: bool = True,
                 cache_ttl: str = "5m", stream: bool = False, thinking_budget: int | None = None,
                 timeout_s: float = 600.0, temperature: float | None = None, http_client=None, **kw):
        super().__init__(model, base_url, **kw)
        if cache_ttl not in ("5m", "1h"):
            raise ValueError(f"cache_ttl must be '5m' or '1h', got {cache_ttl!r}")
        import anthropic

        key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        token = None if key else os.environ.get("ANTHROPIC_AUTH_TOKEN")
        if not key and not token:
            if base_url:
                key = "EMPTY"
            else:
                raise BackendError("no API key: set ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN) or pass api_key",
                                   kind="config")
        self.cache, self.cache_ttl, self.stream = cache, cache_ttl, stream
        self.thinking_budget, self.temperature = thinking_budget, temperature
        self.client = anthropic.Anthropic(api_key=key, auth_token=token, base_url=base_url, max_retries=0,
                                          timeout=timeout_s, http_client=http_client)

    def _marker(self) -> dict:
        return {"type": "ephemeral", "ttl": "1h"} if self.cache_ttl == "1h" else {"type": "ephemeral"}

    def wire_messages(self, messages: list[dict]) -> list[dict]:
        """Neutral messages -> Messages API messages (tool results merged into user turns)."""
        out: list[dict] = []

        def push(role: str, blocks: list[dict]) -> None:
            if out and out[-1]["role"] == role:
                out[-1]["content"].extend(blocks)
            else:
                out.append({"role": role, "content": blocks})

        for m in messages:
            role = m["role"]
            if role == "assistant":
                if m.get("provider") == "anthropic" and m.get("provider_items"):
                    blocks = [dict(b) for b in m["provider_items"]]
                else:
                    blocks = [{"type": "text", "text": m["content"]}] if m.get("content") else []
                    blocks += [{"type": "tool_use", "id": tc["id"], "name": tc["name"],
                                "input": tc.get("arguments") or {}} for tc in m.get("tool_calls") or []]
                push("assistant", blocks or [{"type": "text", "text": "(no output)"}])
            elif role == "tool":
                block = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m.get("content", "")}
                if m.get("is_error"):
                    block["is_error"] = True
                push("user", [block])
            else:
                content = m.get("content", "")
                push("user", [{"type": "text", "text": content}] if isinstance(content, str) else list(content))
        if self.cache and out and out[-1]["content"]:
            last = dict(out[-1]["content"][-1])
            last["cache_control"] = self._marker()
            out[-1] = {"role": out[-1]["role"], "content": out[-1]["content"][:-1] + [last]}
        return out

    def _once(self, messages, system, tools, json_schema, max_tokens) -> Completion:
        req: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens, "messages": self.wire_messages(messages)}
        if system:
            block: dict = {"type": "text", "text": system}
            if self.cache:
                block["cache_control"] = self._marker()
            req["system"] = [block]
        wire_tools = [{"name": t["name"], "description": t.get("description", ""),
                       "input_schema": t.get("parameters", {"type": "object"})} for t in tools or []]
        if json_schema is not None:
            wire_tools.append({"name": STRUCTURED_TOOL, "description": "Give the answer as this JSON object.",
                               "input_schema": json_schema})
            req["tool_choice"] = ({"type": "tool", "name": STRUCTURED_TOOL} if not tools else {"type": "any"})
        if wire_tools:
            if self.cache:
                wire_tools[-1] = {**wire_tools[-1], "cache_control": self._marker()}
            req["tools"] = wire_tools
        if self.thinking_budget:
            req["thinking"] = {"type": "enabled", "budget_tokens": self.thinking_budget}
        if self.temperature is not None:
            req["temperature"] = self.temperature
        try:
            if self.stream:
                with self.client.messages.stream(**req) as s:
                    msg = s.get_final_message()
            else:
                msg = self.client.messages.create(**req)
        except Exception as e:  # noqa: BLE001
            import anthropic

            if isinstance(e, (anthropic.APIStatusError, anthropic.APIConnectionError)):
                raise
            raise MalformedOutputError(f"malformed Messages reply: {type(e).__name__}: {e}") from None
        raw = (msg.model_dump(mode="json", exclude_none=True, warnings=False) if hasattr(msg, "model_dump")
               else dict(msg))
        content = raw.get("content")
        if not isinstance(content, list):
            raise MalformedOutputError(f"Messages reply without content: {json.dumps(raw)[:300]}", raw=raw)
        texts, calls, parsed = [], [], None
        for b in content:
            if b.get("type") == "text":
                texts.append(b.get("text", ""))
            elif b.get("type") == "tool_use":
                if json_schema is not None and b.get("name") == STRUCTURED_TOOL:
                    parsed = b.get("input")
                    continue
                calls.append(make_tool_call(b.get("id", ""), b.get("name", ""), b.get("input")))
        comp = Completion(text="".join(texts), tool_calls=calls, usage=messages_usage(raw.get("usage"), self.cache_ttl),
                          raw=raw, model=raw.get("model") or self.model, stop_reason=raw.get("stop_reason"),
                          provider="anthropic", provider_items=content)
        if json_schema is not None:
            if not isinstance(parsed, dict):
                raise MalformedOutputError("structured output: the model did not call the structured_output tool",
                                           raw=raw)
            comp.parsed = parsed
            comp.text = json.dumps(parsed)
        return comp

    def complete(self, messages: list[dict], *, system: str | None = None, tools: list[dict] | None = None,
                 json_schema: dict | None = None, max_tokens: int = 4096) -> Completion:
        """One model response (see :meth:`Backend.complete`). Structured output (``json_schema``)
        is a forced tool call whose input is the answer."""
        return with_retries(lambda: self._once(messages, system, tools, json_schema, max_tokens), self.retry,
                            _classify, self.on_retry)

    def close(self) -> None:
        self.client.close()
