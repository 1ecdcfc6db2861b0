"""The backend interface: provider-neutral messages, tools, completions, usage and retries.

Messages (the ``messages`` argument of :meth:`Backend.complete`) use one neutral format,
converted by each backend to its provider's wire format:

* ``{"role": "user", "content": "text"}``
* ``{"role": "assistant", "content": "text", "tool_calls": [{"id", "name", "arguments": {...}}]}``
  (``tool_calls`` optional). Append :meth:`Completion.message` to the conversation to keep
  provider items verbatim (Anthropic thinking blocks, Responses reasoning items).
* ``{"role": "tool", "tool_call_id": "...", "content": "text"}``: one tool result; add
  ``"is_error": true`` for a failed call.

Tools (the ``tools`` argument) are ``{"name", "description", "parameters": <JSON Schema>}``.

Usage is normalised into disjoint buckets (research notes section 3.1): ``input_tokens`` is the
*uncached* input only; cache reads and writes are counted separately; ``output_tokens``
includes reasoning tokens (also reported in ``reasoning_tokens``, never billed twice).
"""

from __future__ import annotations

import abc
import json
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

log = logging.getLogger(__name__)

#: HTTP statuses retried with backoff (not counted as turns): timeouts, conflicts, rate limits,
#: server errors and Anthropic's 529 "overloaded".
RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})


class BackendError(RuntimeError):
    """A provider or CLI failure that retries did not fix, or that is not retryable.

    Attributes:
        kind: ``http``, ``connection``, ``malformed`` (the reply could not be parsed),
            ``timeout``, ``cli`` (the agent CLI failed) or ``config``.
        status: the HTTP status where there was one.
        retryable: whether the failure was of a retryable kind (retries were exhausted).
    """

    def __init__(self, message: str, *, kind: str = "http", status: int | None = None, retryable: bool = False):
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.retryable = retryable


class MalformedOutputError(BackendError):
    """The provider answered, but the answer cannot be used (bad JSON, bad tool arguments...)."""

    def __init__(self, message: str, raw: Any = None):
        super().__init__(message, kind="malformed")
        self.raw = raw


class Usage(BaseModel):
    """Token counts of one or more model responses, in disjoint buckets (tokens).

    ``input_tokens`` excludes cache reads and writes; ``cache_write_5m`` / ``cache_write_1h``
    are writes with a 5-minute / 1-hour time to live; ``output_tokens`` includes
    ``reasoning_tokens``.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read: int = 0
    cache_write_5m: int = 0
    cache_write_1h: int = 0
    reasoning_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(**{k: getattr(self, k) + getattr(other, k) for k in Usage.model_fields})

    def __sub__(self, other: Usage) -> Usage:
        return Usage(**{k: getattr(self, k) - getattr(other, k) for k in Usage.model_fields})

    @property
    def cache_write(self) -> int:
        """Cache writes of both lifetimes (tokens)."""
        return self.cache_write_5m + self.cache_write_1h

    @property
    def total_input(self) -> int:
        """Every prompt token: uncached + cache read + cache write."""
        return self.input_tokens + self.cache_read + self.cache_write

    @classmethod
    def total(cls, items) -> Usage:
        out = cls()
        for u in items:
            out = out + u
        return out


class ToolCall(BaseModel):
    """One tool call of a model response; ``arguments`` is the decoded JSON object.

    When the model sent arguments that are not a JSON object, ``arguments`` is empty,
    ``arguments_error`` says why and ``raw_arguments`` keeps the text (a malformed call is
    answered with an error tool result, not executed).
    """

    id: str
    name: str
    arguments: dict = Field(default_factory=dict)
    arguments_error: str | None = None
    raw_arguments: str | None = None


class Completion(BaseModel):
    """One model response (one turn), or for a CLI backend one whole CLI session.

    Attributes:
        text: the assistant's text (for ``json_schema`` requests: the JSON document).
        tool_calls: tool calls requested by the model (empty for CLI backends, whose own tool
            calls are in ``raw["events"]``).
        usage: tokens of this response (of every model call, for a CLI session).
        raw: the provider's response as JSON (for CLI backends: events and result).
        model: the model that answered, as the provider names it.
        stop_reason: the provider's stop / finish reason.
        parsed: the decoded JSON object when ``json_schema`` was given.
        retries: failed attempts (429 / 5xx / 529 / connection) before this response; not turns.
        retry_errors: one line per failed attempt.
        turns: model responses behind this completion (1 for API backends).
        cli_cost_usd: the cost the CLI itself reported, where it reports one.
        provider_items: the provider's output items, echoed verbatim in the next request.
    """

    text: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    raw: dict = Field(default_factory=dict)
    model: str = ""
    stop_reason: str | None = None
    parsed: Any = None
    retries: int = 0
    retry_errors: list[str] = Field(default_factory=list)
    turns: int = 1
    cli_cost_usd: float | None = None
    provider_items: list = Field(default_factory=list)
    provider: str = ""

    def message(self) -> dict:
        """The assistant message to append to the conversation (neutral format)."""
        msg: dict = {"role": "assistant", "content": self.text}
        if self.tool_calls:
            msg["tool_calls"] = [tc.model_dump(exclude_none=True) for tc in self.tool_calls]
        if self.provider_items:
            msg["provider"] = self.provider
            msg["provider_items"] = self.provider_items
        return msg


class RetryPolicy(BaseModel):
    """Backoff for retryable failures: ``base_s * 2**attempt`` (capped at ``max_s``) with
    +-25 % jitter, or the server's ``retry-after`` when it is at most ``max_s``; at most
    ``max_retries`` retries and ``max_total_s`` seconds of waiting in all."""

    max_retries: int = 8
    base_s: float = 0.5
    max_s: float = 60.0
    max_total_s: float = 600.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None and 0 <= retry_after <= self.max_s:
            return retry_after
        d = min(self.max_s, self.base_s * (2 ** attempt))
        return d * random.uniform(0.75, 1.25)


def parse_retry_after(headers) -> float | None:
    """Seconds from ``retry-after-ms`` or ``retry-after`` (a number) response headers, or None."""
    if headers is None:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return float(ms) / 1000.0
        s = headers.get("retry-after")
        if s is not None:
            return float(s)
    except (TypeError, ValueError):
        return None
    return None


def with_retries(call: Callable[[], Completion], policy: RetryPolicy,
                 classify: Callable[[BaseException], tuple[bool, int | None, float | None, str] | None],
                 on_retry: Callable[[int, str, float], None] | None = None) -> Completion:
    """Run ``call`` until it succeeds, retrying retryable failures with backoff.

    Args:
        call: one attempt; returns a :class:`Completion`.
        policy: the backoff policy.
        classify: maps an exception to ``(retryable, status, retry_after_s, message)``, or
            None for exceptions that are not provider failures (re-raised unchanged).
        on_retry: called as ``on_retry(attempt, message, delay_s)`` before each wait.

    Returns:
        The completion, with ``retries`` and ``retry_errors`` filled in.

    Raises:
        BackendError: a non-retryable failure, or retries exhausted (``retryable=True``).
    """
    errors: list[str] = []
    waited = 0.0
    attempt = 0
    while True:
        try:
            comp = call()
        except BackendError:
            raise
        except Exception as e:  # noqa: BLE001 - classified below
            info = classify(e)
            if info is None:
                raise
            retryable, status, retry_after, message = info
            line = f"{status or type(e).__name__}: {message}"
            if not retryable:
                raise BackendError(f"provider error {line}", kind="http" if status else "connection",
                                   status=status) from e
            errors.append(line)
            if attempt >= policy.max_retries or waited >= policy.max_total_s:
                raise BackendError(f"giving up after {attempt + 1} attempts; last error {line}",
                                   kind="http" if status else "connection", status=status, retryable=True) from e
            d = min(policy.delay(attempt, retry_after), max(0.0, policy.max_total_s - waited))
            log.warning("retryable provider error (attempt %d): %s; waiting %.2f s", attempt + 1, line, d)
            if on_retry:
                on_retry(attempt, line, d)
            time.sleep(d)
            waited += d
            attempt += 1
            continue
        comp.retries = attempt
        comp.retry_errors = errors
        return comp


def decode_arguments(text: str | dict | None, tool: str) -> dict:
    """Decode a tool call's JSON arguments.

    Raises:
        MalformedOutputError: not JSON, or not a JSON object.
    """
    if isinstance(text, dict):
        return text
    if text is None or text == "":
        return {}
    try:
        val = json.loads(text)
    except json.JSONDecodeError as e:
        raise MalformedOutputError(f"tool call {tool!r} has arguments that are not valid JSON ({e}): {text[:200]!r}",
                                   raw=text) from None
    if not isinstance(val, dict):
        raise MalformedOutputError(f"tool call {tool!r} has arguments that are not a JSON object: {text[:200]!r}",
                                   raw=text)
    return val


def make_tool_call(call_id: str, name: str, args: str | dict | None) -> ToolCall:
    """A :class:`ToolCall` from raw arguments; malformed arguments are kept, not raised."""
    try:
        return ToolCall(id=call_id, name=name, arguments=decode_arguments(args, name))
    except MalformedOutputError as e:
        return ToolCall(id=call_id, name=name, arguments_error=str(e),
                        raw_arguments=args if isinstance(args, str) else json.dumps(args))


def parse_json_text(text: str) -> Any:
    """Decode a structured-output reply (tolerates a surrounding Markdown code fence).

    Raises:
        MalformedOutputError: the text is not a JSON document.
    """
    s = text.strip()
    if s.startswith("```"):
        s = s.split("\n", 1)[1] if "\n" in s else ""
        s = s.rsplit("```", 1)[0]
    try:
        return json.loads(s)
    except json.JSONDecodeError as e:
        raise MalformedOutputError(f"structured output is not valid JSON ({e}): {text[:200]!r}", raw=text) from None


class Backend(abc.ABC):
    """One model behind one provider API or agent CLI.

    Subclasses implement :meth:`complete`. Use :func:`d2kbench.agents.backends.get_backend`
    to construct one by name.
    """

    #: registry name (``openai``, ``anthropic``, ``claude-code``, ``codex``)
    name: str = ""
    #: True for agent CLIs, which run their own tool loop (see :meth:`run_session`)
    is_cli: bool = False

    def __init__(self, model: str, base_url: str | None = None, *, retry: RetryPolicy | dict | None = None,
                 on_retry: Callable[[int, str, float], None] | None = None):
        self.model = model
        self.base_url = base_url
        self.retry = RetryPolicy.model_validate(retry) if isinstance(retry, dict) else (retry or RetryPolicy())
        self.on_retry = on_retry

    @abc.abstractmethod
    def complete(self, messages: list[dict], *, system: str | None = None, tools: list[dict] | None = None,
                 json_schema: dict | None = None, max_tokens: int = 4096) -> Completion:
        """One model response to ``messages``.

        Args:
            messages: the conversation in the neutral format (module docstring).
            system: the system prompt.
            tools: tools the model may call (neutral format).
            json_schema: ask for a JSON document of this schema (structured output); the
                decoded document is in ``Completion.parsed`` and its text in ``Completion.text``.
            max_tokens: the most output tokens of the response.

        Returns:
            A :class:`Completion`. Retries of 429 / 5xx / 529 / connection failures happen
            inside and are reported in ``retries``; they are not turns.

        Raises:
            BackendError: the provider failed after retries or with a non-retryable error.
            MalformedOutputError: the response could not be parsed.
        """

    def close(self) -> None:  # noqa: B027 - an optional hook: backends without connections keep the no-op
        """Release connections (idempotent)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r}, base_url={self.base_url!r})"
