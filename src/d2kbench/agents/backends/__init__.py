"""Model backends behind one interface: :func:`get_backend` and :class:`Backend`.

Names:

* ``openai``: any OpenAI-compatible endpoint (hosted, vLLM, SGLang) through the official
  SDK; option ``api="chat"`` (Chat Completions, default) or ``api="responses"``.
* ``anthropic``: the Messages API through the official SDK, with prompt-cache breakpoints.
* ``claude-code``: the Claude Code CLI (``claude -p --output-format stream-json``).
* ``codex``: the Codex CLI (``codex exec --json``).

Every backend answers ``complete(messages, system=, tools=, json_schema=, max_tokens=)`` with
a :class:`Completion` (``text``, ``tool_calls``, ``usage``, ``raw``); 429 / 5xx / 529 and
connection failures are retried with backoff inside and are not turns. The CLI backends also
run whole agent sessions (:meth:`CliBackend.run_session`).

Example (the LLM judge)::

    from d2kbench.agents.backends import get_backend
    b = get_backend("openai", "gpt-5.6", api="responses")
    c = b.complete([{"role": "user", "content": "..."}], system="...", json_schema=schema)
    c.parsed, c.usage.output_tokens
"""

from __future__ import annotations

from d2kbench.agents.backends.base import (
    Backend,
    BackendError,
    Completion,
    MalformedOutputError,
    RetryPolicy,
    ToolCall,
    Usage,
)

# Imports inside functions: each backend module (and its provider SDK) loads only when that backend is asked for.

#: Registry names accepted by :func:`get_backend`.
BACKENDS = ("openai", "anthropic", "claude-code", "codex")


def get_backend(name: str, model: str, base_url: str | None = None, **opts) -> Backend:
    """Construct a backend by registry name.

    Args:
        name: one of :data:`BACKENDS`.
        model: the provider's model id (e.g. ``claude-sonnet-4-6``, ``gpt-5.6``).
        base_url: the API base URL (OpenAI clients: ending in ``/v1``); default: the
            provider's public endpoint (CLI backends: their own default).
        **opts: backend options (see each backend class): e.g. ``api="responses"``,
            ``stream=True``, ``retry=RetryPolicy(...)``, ``cache_ttl="1h"``, ``timeout_s``.

    Returns:
        A :class:`Backend`.

    Raises:
        ValueError: unknown backend name or option value.
        BackendError: missing configuration (``kind="config"``: no API key, CLI not installed).
    """
    if name == "openai":
        from d2kbench.agents.backends.openai_backend import OpenAIBackend

        return OpenAIBackend(model, base_url, **opts)
    if name == "anthropic":
        from d2kbench.agents.backends.anthropic_backend import AnthropicBackend

        return AnthropicBackend(model, base_url, **opts)
    if name == "claude-code":
        from d2kbench.agents.backends.claude_code import ClaudeCodeBackend

        return ClaudeCodeBackend(model, base_url, **opts)
    if name == "codex":
        from d2kbench.agents.backends.codex import CodexBackend

        return CodexBackend(model, base_url, **opts)
    raise ValueError(f"unknown backend {name!r} (known: {', '.join(BACKENDS)})")


__all__ = ["BACKENDS", "Backend", "BackendError", "Completion", "MalformedOutputError", "RetryPolicy", "ToolCall",
           "Usage", "get_backend"]
