"""The Claude Code CLI backend: ``claude -p --output-format stream-json``.

Accounting (research notes section 1.2): one API response with several content blocks comes
as several ``assistant`` lines that share ``message.id``, intermediate ones with partial
``output_tokens``; a turn is a distinct ``message.id`` and its usage is the field-wise maximum
over its lines, then replaced by the final usage from the native session file
(``$CLAUDE_CONFIG_DIR/projects/<slug>/<session>.jsonl``). The ``result`` line's totals are a
cross-check only (never added on top); its ``total_cost_usd`` is kept as the CLI's own cost.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from d2kbench.agents.backends.anthropic_backend import messages_usage
from d2kbench.agents.backends.base import ToolCall, Usage
from d2kbench.agents.backends.cli import CliBackend, CliTurn, SessionResult, StreamParser, base_env, run_cli
from d2kbench.agents.workspace import WorkspaceConfig

#: How long one tool call may take (ms), an MCP tool or a Bash command alike: the longest is a
#: submit that waits for a slow evaluation (``WorkspaceConfig.submit_timeout_s``, 2 h) and then
#: answers; 10 minutes more, so that Claude Code never kills (or backgrounds) a submit first.
TOOL_TIMEOUT_MS = int((WorkspaceConfig.model_fields["submit_timeout_s"].default + 600) * 1000)
#: Tools removed from Claude Code for fair, accountable runs (web access, sub-agents, schedulers).
DISALLOWED_TOOLS = ("WebSearch", "WebFetch", "Task", "Agent", "Workflow", "ScheduleWakeup", "CronCreate",
                    "RemoteTrigger", "SendMessage")


def _max_usage(a: Usage, b: Usage) -> Usage:
    return Usage(**{k: max(getattr(a, k), getattr(b, k)) for k in Usage.model_fields})


class ClaudeStreamParser(StreamParser):
    """Parses ``stream-json`` lines: turns by distinct ``message.id``, tool calls and results."""

    def __init__(self, config_dir: Path | None = None, **kw):
        super().__init__(**kw)
        self.config_dir = config_dir
        self.by_id: dict[str, CliTurn] = {}
        self.pending: set[str] = set()
        self.session_id: str | None = None
        self.result: dict | None = None
        self.init: dict | None = None

    def feed(self, obj: dict) -> None:
        t = obj.get("type")
        if t == "system" and obj.get("subtype") == "init":
            self.init = obj
            self.session_id = obj.get("session_id")
            self.emit("session", {"cli": "claude-code", "model": obj.get("model"), "tools": obj.get("tools"),
                                  "mcp_servers": obj.get("mcp_servers"), "version": obj.get("claude_code_version")})
        elif t == "assistant":
            self._assistant(obj.get("message") or {})
        elif t == "user":
            content = (obj.get("message") or {}).get("content")
            for b in content if isinstance(content, list) else []:
                if isinstance(b, dict) and b.get("type") == "tool_result":
                    self.pending.discard(b.get("tool_use_id", ""))
                    c = b.get("content")
                    if isinstance(c, list):
                        c = "\n".join(x.get("text", "") for x in c if isinstance(x, dict))
                    self.emit("tool_result", {"tool_call_id": b.get("tool_use_id"), "is_error": bool(b.get("is_error")),
                                              "content": str(c)[:4000]})
        elif t == "result":
            self.result = obj
            self.final_text = obj.get("result") or self.final_text
            if obj.get("is_error") or obj.get("subtype") not in (None, "success"):
                errs = obj.get("errors") or obj.get("result") or ""
                self.error = f"{obj.get('subtype')}: {errs}"

    def _assistant(self, msg: dict) -> None:
        mid = msg.get("id") or f"anon-{len(self.turns) + 1}"
        turn = self.by_id.get(mid)
        new = turn is None
        if turn is None:
            turn = CliTurn(index=len(self.turns) + 1, message_id=mid, model=msg.get("model", ""))
            self.by_id[mid] = turn
            self.turns.append(turn)
        if msg.get("usage"):
            turn.usage = _max_usage(turn.usage, messages_usage(msg["usage"]))
        for b in msg.get("content") or []:
            if not isinstance(b, dict):
                continue
            if b.get("type") == "text" and b.get("text"):
                turn.text = (turn.text + "\n" + b["text"]).strip()
                self.emit("message", {"turn": turn.index, "text": b["text"]})
            elif b.get("type") == "tool_use":
                args = b.get("input")
                tc = ToolCall(id=b.get("id", ""), name=b.get("name", ""), arguments=args if isinstance(args, dict) else {})
                turn.tool_calls.append(tc)
                self.pending.add(tc.id)
                self.emit("tool_call", {"turn": turn.index, **tc.model_dump(exclude_none=True)})
        if new and self.on_turn:
            self.on_turn(turn)

    def should_stop(self, budget: int | None) -> bool:
        if budget is None or not self.turns:
            return False
        if len(self.turns) > budget:
            return True
        last = self.turns[-1]
        return len(self.turns) == budget and bool(last.tool_calls) and not self.pending

    def session_files(self) -> list[Path]:
        """The native session JSONL files of this run."""
        if not self.config_dir or not (self.config_dir / "projects").is_dir():
            return []
        name = f"{self.session_id}.jsonl" if self.session_id else "*.jsonl"
        return sorted((self.config_dir / "projects").glob(f"*/{name}"))

    def finish(self, res: SessionResult) -> None:
        # final per-message usage from the native session file (stream lines carry partial output counts)
        for f in self.session_files():
            for line in f.read_text(errors="replace").splitlines():
                try:
                    e = json.loads(line)
                except json.JSONDecodeError:
                    continue
                msg = e.get("message") if e.get("type") == "assistant" else None
                if isinstance(msg, dict) and msg.get("id") in self.by_id and msg.get("usage"):
                    turn = self.by_id[msg["id"]]
                    turn.usage = _max_usage(turn.usage, messages_usage(msg["usage"]))
        r = self.result
        if not r:
            return
        res.cli_cost_usd = r.get("total_cost_usd")
        if r.get("usage"):
            res.reported_usage = messages_usage(r["usage"])
        res.structured = r.get("structured_output")
        ours = {t.model for t in self.turns}
        for model, mu in (r.get("modelUsage") or {}).items():
            if model in ours:
                continue
            res.other_models[model] = Usage(
                input_tokens=mu.get("inputTokens", 0), output_tokens=mu.get("outputTokens", 0),
                cache_read=mu.get("cacheReadInputTokens", 0),
                cache_write_5m=mu.get("cacheCreationEphemeral5mInputTokens",
                                      mu.get("cacheCreationInputTokens", 0)),
                cache_write_1h=mu.get("cacheCreationEphemeral1hInputTokens", 0))


class ClaudeCodeBackend(CliBackend):
    """Claude Code driven headless (``claude -p``), one private ``CLAUDE_CONFIG_DIR`` per session.

    Options (besides :class:`CliBackend`'s): ``effort`` (``--effort``), ``disallowed_tools``.
    With a ``base_url`` (a gateway or the fake provider) the key goes in ``ANTHROPIC_AUTH_TOKEN``
    (``"fake"`` when none is given).
    """

    name = "claude-code"
    binary_name = "claude"

    def __init__(self, model: str, base_url: str | None = None, *, effort: str | None = None,
                 disallowed_tools: tuple[str, ...] = DISALLOWED_TOOLS, **kw):
        super().__init__(model, base_url, **kw)
        self.effort = effort
        self.disallowed_tools = disallowed_tools

    def env(self, config_dir: Path) -> dict[str, str]:
        extra = {"CLAUDE_CONFIG_DIR": str(config_dir), "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                 "IS_SANDBOX": "1", "CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1", "DISABLE_AUTOUPDATER": "1",
                 "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1",
                 # MCP tools in the first request (not deferred behind a tool search), and a
                 # tool call may run as long as an evaluation takes
                 "ENABLE_TOOL_SEARCH": "false", "MCP_TIMEOUT": "120000", "MCP_TOOL_TIMEOUT": str(TOOL_TIMEOUT_MS),
                 # ... and so may a tools/submit through Bash: never killed, never moved to the background
                 "BASH_DEFAULT_TIMEOUT_MS": str(TOOL_TIMEOUT_MS), "BASH_MAX_TIMEOUT_MS": str(TOOL_TIMEOUT_MS),
                 "CLAUDE_CODE_DISABLE_BACKGROUND_TASKS": "1"}
        key = self.api_key or os.environ.get("ANTHROPIC_API_KEY")
        if self.base_url:
            extra["ANTHROPIC_BASE_URL"] = self.base_url
            if key:
                extra["ANTHROPIC_API_KEY"] = key
            else:
                extra["ANTHROPIC_AUTH_TOKEN"] = os.environ.get("ANTHROPIC_AUTH_TOKEN", "fake")
        elif key:
            extra["ANTHROPIC_API_KEY"] = key
        extra.update(self.extra_env)
        return base_env(extra)

    def argv(self, config_dir: Path, *, system: str | None, mcp_servers: dict | None,
             json_schema: dict | None) -> list[str]:
        argv = [self.binary, "-p", "--verbose", "--output-format", "stream-json", "--model", self.model,
                "--permission-mode", "bypassPermissions", "--strict-mcp-config"]
        if self.disallowed_tools:
            argv += ["--disallowedTools", ",".join(self.disallowed_tools)]
        if self.effort:
            argv += ["--effort", self.effort]
        if mcp_servers:
            cfg = config_dir / "mcp.json"
            cfg.write_text(json.dumps({"mcpServers": {n: {"type": "stdio", **s} for n, s in mcp_servers.items()}},
                                      indent=1))
            argv += ["--mcp-config", str(cfg)]
        if system:
            argv += ["--append-system-prompt", system]
        if json_schema is not None:
            argv += ["--json-schema", json.dumps(json_schema)]
        return argv + self.extra_args

    def run_session(self, prompt: str, *, cwd: Path, config_dir: Path, events_path: Path,
                    budget_turns: int | None = None, timeout_s: float | None = None, system: str | None = None,
                    mcp_servers: dict | None = None, json_schema: dict | None = None,
                    on_turn: Callable[[CliTurn], None] | None = None,
                    on_event: Callable[[str, dict], None] | None = None) -> SessionResult:
        """See :meth:`CliBackend.run_session`."""
        config_dir.mkdir(parents=True, exist_ok=True)
        parser = ClaudeStreamParser(config_dir=config_dir, on_turn=on_turn, on_event=on_event)
        return run_cli(self.argv(config_dir, system=system, mcp_servers=mcp_servers, json_schema=json_schema),
                       cwd=Path(cwd), env=self.env(config_dir), prompt=prompt, parser=parser, events_path=events_path,
                       timeout_s=timeout_s or self.timeout_s, budget_turns=budget_turns, config_dir=config_dir)
