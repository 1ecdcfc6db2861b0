"""The Codex CLI backend: ``codex exec --json``, one private ``CODEX_HOME`` per session.

Accounting (research notes section 1.3): ``turn.completed.usage`` is *cumulative* over every
model call of the (whole) Codex turn, and ``input_tokens`` *includes* ``cached_input_tokens``.
Per-call usage comes from the rollout file (``$CODEX_HOME/sessions/YYYY/MM/DD/rollout-*.jsonl``).
Newer Codex writes one ``token_usage_record`` per model response (``response_id``, running
``thread_token_usage``) as soon as it completes; older Codex only ``token_count`` events with
running totals, written late and sometimes repeated. Either way one model call (one turn of
ours) is a new response id or a changed total, and its usage is the *delta* of the running
totals. The rollout is tailed live to enforce the budget.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from d2kbench.agents.backends.base import ToolCall, Usage
from d2kbench.agents.backends.cli import CliBackend, CliTurn, SessionResult, StreamParser, base_env, run_cli

#: Environment variable that carries the key for the custom model provider.
PROVIDER_KEY_ENV = "D2K_CODEX_API_KEY"


def codex_usage(u: dict | None) -> Usage:
    """Disjoint buckets from a Codex usage record (``input_tokens`` includes cached ones)."""
    u = u or {}
    cached = int(u.get("cached_input_tokens") or 0)
    written = int(u.get("cache_write_input_tokens") or 0)
    return Usage(input_tokens=max(0, int(u.get("input_tokens") or 0) - cached - written), cache_read=cached,
                 cache_write_5m=written, output_tokens=int(u.get("output_tokens") or 0),
                 reasoning_tokens=int(u.get("reasoning_output_tokens") or 0))


def _toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid TOML basic string


class CodexParser(StreamParser):
    """Parses ``codex exec --json`` stdout (items, cumulative ``turn.completed``) and tails the
    rollout files for per-call ``token_count`` totals."""

    def __init__(self, config_dir: Path, **kw):
        super().__init__(**kw)
        self.config_dir = config_dir
        self.offsets: dict[Path, int] = {}
        self.last_total: dict | None = None
        self.in_flight: set[str] = set()
        self.reported = Usage()
        self.budget_reached_at: float | None = None
        self.mode: str | None = None  # "record" (token_usage_record) or "token_count"
        self.seen_responses: set[str] = set()
        self.last_tool_done = 0.0
        self.model = ""

    # ---- stdout -----------------------------------------------------------------------------
    def feed(self, obj: dict) -> None:
        t = obj.get("type", "")
        if t == "thread.started":
            self.emit("session", {"cli": "codex", "thread_id": obj.get("thread_id")})
        elif t.startswith("item."):
            self._item(t, obj.get("item") or {})
        elif t == "turn.completed":
            # cumulative over the calls of this Codex turn: keep as the cross-check total
            self.reported = self.reported + codex_usage(obj.get("usage"))
        elif t == "turn.failed":
            self.error = f"turn.failed: {(obj.get('error') or {}).get('message', obj.get('error'))}"
        elif t == "error":
            self.error = f"error: {obj.get('message')}"

    def _turn_index(self) -> int:
        return max(1, len(self.turns))

    def _item(self, t: str, item: dict) -> None:
        kind, iid = item.get("type"), item.get("id", "")
        if kind in ("command_execution", "mcp_tool_call"):
            if kind == "command_execution":
                name, args = "shell", {"command": item.get("command")}
            else:
                name, args = f"mcp__{item.get('server')}__{item.get('tool')}", item.get("arguments") or {}
            if t == "item.started" or (t == "item.completed" and iid not in self.in_flight and iid):
                self.in_flight.add(iid)
                tc = ToolCall(id=iid, name=name, arguments=args if isinstance(args, dict) else {"value": args})
                if self.turns:
                    self.turns[-1].tool_calls.append(tc)
                self.emit("tool_call", {"turn": self._turn_index(), **tc.model_dump(exclude_none=True)})
            if t == "item.completed":
                self.in_flight.discard(iid)
                self.last_tool_done = time.monotonic()
                out = item.get("aggregated_output") if kind == "command_execution" else (item.get("result") or item.get("error"))
                failed = item.get("status") == "failed" or bool(item.get("error")) or (
                    kind == "command_execution" and item.get("exit_code") not in (0, None))
                self.emit("tool_result", {"tool_call_id": iid, "is_error": failed,
                                          "content": (out if isinstance(out, str) else json.dumps(out))[:4000]})
        elif kind == "agent_message" and t == "item.completed":
            text = item.get("text", "")
            self.final_text = text
            if self.turns:
                self.turns[-1].text = (self.turns[-1].text + "\n" + text).strip()
            self.emit("message", {"turn": self._turn_index(), "text": text})
        elif kind == "error" and t == "item.completed":
            self.emit("warning", {"message": item.get("message")})
        elif kind == "file_change" and t == "item.completed":
            self.emit("tool_result", {"tool_call_id": iid, "is_error": False,
                                      "content": json.dumps(item.get("changes"))[:4000]})

    # ---- rollout ----------------------------------------------------------------------------
    def poll(self) -> None:
        """Read new lines of the rollout files; each new ``token_count`` total is one turn."""
        root = self.config_dir / "sessions"
        if not root.is_dir():
            return
        for f in sorted(root.rglob("rollout-*.jsonl")):
            off = self.offsets.get(f, 0)
            try:
                with open(f, "rb") as fh:
                    fh.seek(off)
                    data = fh.read()
            except OSError:
                continue
            end = data.rfind(b"\n")
            if end < 0:
                continue
            self.offsets[f] = off + end + 1
            for line in data[: end + 1].splitlines():
                try:
                    e = json.loads(line)
                except json.JSONDecodeError:
                    continue
                self._rollout(e)

    def _rollout(self, e: dict) -> None:
        p = e.get("payload") or {}
        kind = e.get("type")
        if kind == "turn_context" and p.get("model"):
            self.model = p["model"]
        if kind == "token_usage_record" and self.mode != "token_count":
            # newer Codex: one record per model response, written as soon as it completes
            self.mode = "record"
            rid = p.get("response_id") or f"record-{e.get('ordinal')}"
            if rid in self.seen_responses:
                return
            self.seen_responses.add(rid)
            total = p.get("thread_token_usage")
            if total:
                delta = codex_usage(total) - (codex_usage(self.last_total) if self.last_total else Usage())
                self.last_total = total
            else:
                delta = codex_usage(p.get("usage"))
            self._new_turn(delta, rid)
        elif kind == "event_msg" and p.get("type") == "token_count" and self.mode != "record":
            # older Codex: running totals; a changed total is a new model call
            total = (p.get("info") or {}).get("total_token_usage")
            if not total or total == self.last_total:
                return  # a repeated report, not a new model call
            self.mode = "token_count"
            prev = codex_usage(self.last_total) if self.last_total else Usage()
            self.last_total = total
            self._new_turn(codex_usage(total) - prev, f"call-{len(self.turns) + 1}")

    def _new_turn(self, usage: Usage, message_id: str) -> None:
        turn = CliTurn(index=len(self.turns) + 1, message_id=message_id, model=self.model, usage=usage)
        self.turns.append(turn)
        if self.on_turn:
            self.on_turn(turn)

    def should_stop(self, budget: int | None) -> bool:
        if budget is None:
            return False
        if len(self.turns) > budget:
            return True
        if len(self.turns) == budget:
            now = time.monotonic()
            if self.budget_reached_at is None:
                self.budget_reached_at = now
            # let the last response's tool calls finish, then stop before the next call
            return not self.in_flight and now - self.budget_reached_at > 1.0
        return False

    def finish(self, res: SessionResult) -> None:
        self.poll()
        res.reported_usage = self.reported if self.reported != Usage() else None


class CodexBackend(CliBackend):
    """Codex driven headless (``codex exec --json``).

    With a ``base_url`` (an OpenAI-compatible gateway or the fake provider, ending in ``/v1``)
    a custom model provider is written to the private ``config.toml`` (``wire_api`` option:
    ``responses``, default, or ``chat``). Options: ``reasoning_effort``, ``wire_api``,
    ``sandbox`` (``bypass``, default: no Codex sandbox, for containers; or ``workspace-write``).
    """

    name = "codex"
    binary_name = "codex"

    def __init__(self, model: str, base_url: str | None = None, *, reasoning_effort: str | None = None,
                 wire_api: str = "responses", sandbox: str = "bypass", **kw):
        super().__init__(model, base_url, **kw)
        if sandbox not in ("bypass", "workspace-write", "read-only"):
            raise ValueError(f"unknown codex sandbox {sandbox!r} (bypass, workspace-write, read-only)")
        self.reasoning_effort, self.wire_api, self.sandbox = reasoning_effort, wire_api, sandbox

    def write_config(self, config_dir: Path, mcp_servers: dict | None) -> Path:
        """Write ``config.toml`` into the session's ``CODEX_HOME``."""
        lines = [f"model = {_toml_str(self.model)}", 'approval_policy = "never"', 'web_search = "disabled"']
        if self.reasoning_effort:
            lines.append(f"model_reasoning_effort = {_toml_str(self.reasoning_effort)}")
        if self.base_url:
            lines.insert(1, 'model_provider = "d2k"')
        lines += ["", "[features]", "memories = false"]
        if self.base_url:
            lines += ["", "[model_providers.d2k]", 'name = "d2k"', f"base_url = {_toml_str(self.base_url)}",
                      f'env_key = "{PROVIDER_KEY_ENV}"', f"wire_api = {_toml_str(self.wire_api)}",
                      "request_max_retries = 8", "stream_max_retries = 8"]
        for name, s in (mcp_servers or {}).items():
            lines += ["", f"[mcp_servers.{name}]", f"command = {_toml_str(s['command'])}",
                      "args = [" + ", ".join(_toml_str(a) for a in s.get("args", [])) + "]",
                      "startup_timeout_sec = 120", "tool_timeout_sec = 7200", "required = true"]
            if s.get("env"):
                lines += [f"[mcp_servers.{name}.env]"] + [f"{k} = {_toml_str(v)}" for k, v in s["env"].items()]
        path = config_dir / "config.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def env(self, config_dir: Path) -> dict[str, str]:
        extra = {"CODEX_HOME": str(config_dir)}
        key = self.api_key or os.environ.get("OPENAI_API_KEY") or os.environ.get("CODEX_API_KEY")
        if self.base_url:
            extra[PROVIDER_KEY_ENV] = key or "fake"
        elif key:
            extra["OPENAI_API_KEY"] = extra["CODEX_API_KEY"] = key
        extra.update(self.extra_env)
        return base_env(extra)

    def run_session(self, prompt: str, *, cwd: Path, config_dir: Path, events_path: Path,
                    budget_turns: int | None = None, timeout_s: float | None = None, system: str | None = None,
                    mcp_servers: dict | None = None, json_schema: dict | None = None,
                    on_turn: Callable[[CliTurn], None] | None = None,
                    on_event: Callable[[str, dict], None] | None = None) -> SessionResult:
        """See :meth:`CliBackend.run_session`. ``system`` is prepended to the prompt."""
        config_dir.mkdir(parents=True, exist_ok=True)
        self.write_config(config_dir, mcp_servers)
        last = config_dir / "last_message.txt"
        argv = [self.binary, "exec", "--json", "--skip-git-repo-check", "--cd", str(cwd), "-o", str(last)]
        if self.sandbox == "bypass":
            argv.append("--dangerously-bypass-approvals-and-sandbox")
        else:
            argv += ["--sandbox", self.sandbox]
        if json_schema is not None:
            schema_file = config_dir / "output_schema.json"
            schema_file.write_text(json.dumps(json_schema))
            argv += ["--output-schema", str(schema_file)]
        argv += self.extra_args + ["-"]
        if system:
            prompt = f"{system}\n\n{prompt}"
        parser = CodexParser(config_dir, on_turn=on_turn, on_event=on_event)
        res = run_cli(argv, cwd=Path(cwd), env=self.env(config_dir), prompt=prompt, parser=parser,
                      events_path=events_path, timeout_s=timeout_s or self.timeout_s, budget_turns=budget_turns,
                      poll=parser.poll, config_dir=config_dir)
        if last.is_file() and last.read_text().strip():
            res.text = last.read_text()
        return res
