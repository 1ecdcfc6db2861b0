"""OpenAI-compatible backends through the official ``openai`` SDK.

``api="chat"`` (default) speaks Chat Completions, which every OpenAI-compatible server
(vLLM, SGLang, hosted vendors) offers; ``api="responses"`` speaks the Responses API
(stateless: ``store=False``, earlier output items are echoed back verbatim).
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
    parse_json_text,
    parse_retry_after,
    with_retries,
)

# Imports inside functions: the openai SDK (an optional extra) loads only when this backend runs.


def _classify(e: BaseException):
    import openai

    if isinstance(e, openai.APIStatusError):
        return (e.status_code in RETRY_STATUSES, e.status_code, parse_retry_after(e.response.headers),
                str(e.message)[:300])
    if isinstance(e, (openai.APIConnectionError, openai.APITimeoutError)):
        return (True, None, None, str(e)[:300])
    return None


def _provider_or_malformed(e: Exception, api: str) -> Exception:
    """Provider errors (HTTP status, connection) pass through for :func:`with_retries`; anything
    else the SDK raised while decoding the reply becomes a :class:`MalformedOutputError`."""
    import openai

    if isinstance(e, (openai.APIStatusError, openai.APIConnectionError, BackendError)):
        return e
    return MalformedOutputError(f"malformed {api} reply: {type(e).__name__}: {e}")


def _dump(obj: Any) -> dict:
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json", exclude_none=True, warnings=False)
    return dict(obj or {})


def _get(obj, *path, default=0):
    for p in path:
        if obj is None:
            return default
        obj = obj.get(p) if isinstance(obj, dict) else getattr(obj, p, None)
    return default if obj is None else obj


def chat_usage(u) -> Usage:
    """Disjoint buckets from a Chat Completions ``usage`` (``prompt_tokens`` includes cache)."""
    if u is None:
        return Usage()
    prompt = _get(u, "prompt_tokens")
    cached = _get(u, "prompt_tokens_details", "cached_tokens")
    written = _get(u, "prompt_tokens_details", "cache_write_tokens")
    return Usage(input_tokens=max(0, prompt - cached - written), cache_read=cached, cache_write_5m=written,
                 output_tokens=_get(u, "completion_tokens"),
                 reasoning_tokens=_get(u, "completion_tokens_details", "reasoning_tokens"))


def responses_usage(u) -> Usage:
    """Disjoint buckets from a Responses ``usage`` (``input_tokens`` includes cache)."""
    if u is None:
        return Usage()
    total = _get(u, "input_tokens")
    cached = _get(u, "input_tokens_details", "cached_tokens")
    written = _get(u, "input_tokens_details", "cache_write_tokens")
    return Usage(input_tokens=max(0, total - cached - written), cache_read=cached, cache_write_5m=written,
                 output_tokens=_get(u, "output_tokens"),
                 reasoning_tokens=_get(u, "output_tokens_details", "reasoning_tokens"))


class OpenAIBackend(Backend):
    """A model behind an OpenAI-compatible endpoint.

    Options (keyword arguments of :func:`get_backend`):
        api: ``chat`` (Chat Completions, default) or ``responses``.
        api_key: default ``$OPENAI_API_KEY`` (``"EMPTY"`` when unset and a base URL is given).
        stream: use server-sent events (default False).
        timeout_s: per request (default 600).
        temperature, reasoning_effort, extra_body: passed through when set.
        http_client: an ``httpx.Client`` (tests: ``httpx.MockTransport``).
    """

    name = "openai"

    def __init__(self, model: str, base_url: str | None = None, *, api: str = "chat", api_key: str | None = None,
                 stream: bool = False, timeout_s: float = 600.0, temperature: float | None = None,
                 reasoning_effort: str | None = None, extra_body: dict | None = None, http_client=None, **kw):
        super().__init__(model, base_url, **kw)
        if api not in ("chat", "responses"):
            raise ValueError(f"unknown OpenAI api {api!r} (chat or responses)")
        import openai

        key = api_key or os.environ.get("OPENAI_API_KEY") or ("EMPTY" if base_url else None)
        if key is None:
            raise BackendError("no API key: set OPENAI_API_KEY or pass api_key (or a base URL of a local server)",
                               kind="config")
        self.api = api
        self.stream = stream
        self.temperature = temperature
        self.reasoning_effort = reasoning_effort
        self.extra_body = extra_body
        self.client = openai.OpenAI(api_key=key, base_url=base_url, max_retries=0, timeout=timeout_s,
                                    http_client=http_client)

    # ---- Chat Completions -------------------------------------------------------------------
    @staticmethod
    def chat_messages(messages: list[dict], system: str | None) -> list[dict]:
        """Neutral messages -> Chat Completions messages."""
        out: list[dict] = [{"role": "system", "content": system}] if system else []
        for m in messages:
            role = m["role"]
            if role == "assistant":
                msg: dict = {"role": "assistant", "content": m.get("content") or None}
                if m.get("tool_calls"):
                    msg["tool_calls"] = [
                        {"id": tc["id"], "type": "function",
                         "function": {"name": tc["name"],
                                      "arguments": tc.get("raw_arguments") or json.dumps(tc.get("arguments", {}))}}
                        for tc in m["tool_calls"]]
                extra = m.get("provider_items") if m.get("provider") == "openai-chat" else None
                if extra and extra[0].get("reasoning_content"):
                    msg["reasoning_content"] = extra[0]["reasoning_content"]
                out.append(msg)
            elif role == "tool":
                out.append({"role": "tool", "tool_call_id": m["tool_call_id"], "content": m.get("content", "")})
            else:
                out.append({"role": role, "content": m.get("content", "")})
        return out

    def _chat(self, messages, system, tools, json_schema, max_tokens) -> Completion:
        req: dict = {"model": self.model, "messages": self.chat_messages(messages, system),
                     "max_completion_tokens": max_tokens}
        if tools:
            req["tools"] = [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                                              "parameters": t.get("parameters", {"type": "object"})}}
                            for t in tools]
        if json_schema is not None:
            req["response_format"] = {"type": "json_schema",
                                      "json_schema": {"name": "output", "schema": json_schema, "strict": True}}
        if self.temperature is not None:
            req["temperature"] = self.temperature
        if self.reasoning_effort:
            req["reasoning_effort"] = self.reasoning_effort
        if self.extra_body:
            req["extra_body"] = self.extra_body
        try:
            if self.stream:
                req["stream_options"] = {"include_usage": True}
                with self.client.chat.completions.stream(**req) as s:
                    resp = s.get_final_completion()
            else:
                resp = self.client.chat.completions.create(**req)
        except Exception as e:  # noqa: BLE001
            raise _provider_or_malformed(e, "Chat Completions") from None
        raw = _dump(resp)
        choices = getattr(resp, "choices", None)
        if not isinstance(choices, list) or not choices or getattr(choices[0], "message", None) is None:
            raise MalformedOutputError(f"Chat Completions reply without choices: {json.dumps(raw)[:300]}", raw=raw)
        ch = choices[0]
        msg = ch.message
        calls = [make_tool_call(tc.id, tc.function.name, tc.function.arguments) for tc in (msg.tool_calls or [])]
        items = []
        reasoning = getattr(msg, "reasoning_content", None) or (msg.model_extra or {}).get("reasoning_content")
        if reasoning:
            items = [{"reasoning_content": reasoning}]
        return Completion(text=msg.content or "", tool_calls=calls, usage=chat_usage(resp.usage), raw=raw,
                          model=resp.model or self.model, stop_reason=ch.finish_reason, provider="openai-chat",
                          provider_items=items)

    # ---- Responses -----------------------------------------------------------------------------
    @staticmethod
    def responses_input(messages: list[dict]) -> list[dict]:
        """Neutral messages -> Responses input items."""
        out: list[dict] = []
        for m in messages:
            role = m["role"]
            if role == "assistant":
                if m.get("provider") == "openai-responses" and m.get("provider_items"):
                    out.extend(m["provider_items"])
                    continue
                if m.get("content"):
                    out.append({"role": "assistant", "content": m["content"]})
                for tc in m.get("tool_calls") or []:
                    out.append({"type": "function_call", "call_id": tc["id"], "name": tc["name"],
                                "arguments": tc.get("raw_arguments") or json.dumps(tc.get("arguments", {}))})
            elif role == "tool":
                out.append({"type": "function_call_output", "call_id": m["tool_call_id"],
                            "output": m.get("content", "")})
            else:
                out.append({"role": role, "content": m.get("content", "")})
        return out

    def _responses(self, messages, system, tools, json_schema, max_tokens) -> Completion:
        req: dict = {"model": self.model, "input": self.responses_input(messages), "store": False,
                     "max_output_tokens": max_tokens}
        if system:
            req["instructions"] = system
        if tools:
            req["tools"] = [{"type": "function", "name": t["name"], "description": t.get("description", ""),
                             "parameters": t.get("parameters", {"type": "object"}), "strict": False} for t in tools]
        if json_schema is not None:
            req["text"] = {"format": {"type": "json_schema", "name": "output", "schema": json_schema, "strict": True}}
        if self.temperature is not None:
            req["temperature"] = self.temperature
        if self.reasoning_effort:
            req["reasoning"] = {"effort": self.reasoning_effort}
            req["include"] = ["reasoning.encrypted_content"]
        if self.extra_body:
            req["extra_body"] = self.extra_body
        try:
            if self.stream:
                with self.client.responses.stream(**req) as s:
                    resp = s.get_final_response()
            else:
                resp = self.client.responses.create(**req)
        except Exception as e:  # noqa: BLE001
            raise _provider_or_malformed(e, "Responses") from None
        raw = _dump(resp)
        output = getattr(resp, "output", None)
        if not isinstance(output, list):
            raise MalformedOutputError(f"Responses reply without output: {json.dumps(raw)[:300]}", raw=raw)
        texts, calls, items = [], [], []
        for item in output:
            d = _dump(item)
            items.append(d)
            if d.get("type") == "message":
                texts += [c.get("text", "") for c in d.get("content", []) if c.get("type") == "output_text"]
            elif d.get("type") == "function_call":
                calls.append(make_tool_call(d.get("call_id") or d.get("id", ""), d.get("name", ""), d.get("arguments")))
        return Completion(text="".join(texts), tool_calls=calls, usage=responses_usage(resp.usage), raw=raw,
                          model=resp.model or self.model, stop_reason=getattr(resp, "status", None),
                          provider="openai-responses", provider_items=items)

    def complete(self, messages: list[dict], *, system: str | None = None, tools: list[dict] | None = None,
                 json_schema: dict | None = None, max_tokens: int = 4096) -> Completion:
        """One model response (see :meth:`Backend.complete`)."""
        fn = self._chat if self.api == "chat" else self._responses
        comp = with_retries(lambda: fn(messages, system, tools, json_schema, max_tokens), self.retry, _classify,
                            self.on_retry)
        if json_schema is not None:
            comp.parsed = parse_json_text(comp.text)
        return comp

    def close(self) -> None:
        self.client.close()
