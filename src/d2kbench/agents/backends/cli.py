"""Shared machinery of the agent-CLI backends (Claude Code, Codex).

A CLI session is one subprocess started in its own session (process group), its prompt fed
from a file on stdin, stdout read line by line (JSONL events) on a thread, a wall-clock limit
and a turn budget enforced by the harness: on either, the whole process group gets SIGTERM,
then SIGKILL after a grace period, so compilers and profilers the agent started die too.
Each session has a private configuration directory (``CLAUDE_CONFIG_DIR`` / ``CODEX_HOME``).

The session runs in an OS sandbox (:func:`agent_sandbox`): it sees the Python runtime and the
CLI's own installation read-only, its workspace and configuration directory writable, and
nothing of the suite, the results store or the project; its tools reach the trusted evaluator
through the workspace's request folder. The network stays (the model endpoint).
"""

from __future__ import annotations

import abc
import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from d2kbench.agents.backends.base import Backend, BackendError, Completion, ToolCall, Usage, parse_json_text
from d2kbench.agents.workspace import load_config
from d2kbench.sandbox import bwrap
from d2kbench.sandbox.policy import agent_policy, installation_paths
from d2kbench.sandbox.process import new_group_dying_with_parent

#: Seconds between SIGTERM and SIGKILL of a session's process group.
KILL_GRACE_S = 5.0


class CliTurn(BaseModel):
    """One model response inside a CLI session (1-based ``index``)."""

    index: int
    message_id: str
    model: str = ""
    usage: Usage = Field(default_factory=Usage)
    text: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)


class SessionResult(BaseModel):
    """What a CLI session produced.

    Attributes:
        turns: model responses in order, usage deduplicated / de-accumulated.
        text: the final answer text.
        usage: the sum of ``turns``' usage.
        reported_usage: the CLI's own total (a cross-check; never added on top).
        other_models: usage of background calls to other models (e.g. a small model), by model.
        cli_cost_usd: the CLI's own cost figure for the session, where it reports one.
        exit_reason: ``completed``, ``budget`` (turn budget reached), ``timeout``,
            ``agent_error`` (the CLI reported a failure) or ``cli_error`` (it exited non-zero
            without a result).
        structured: the structured-output object, when a JSON schema was given.
        events_path: the raw stdout (JSONL) as emitted.
    """

    turns: list[CliTurn] = Field(default_factory=list)
    text: str = ""
    usage: Usage = Field(default_factory=Usage)
    reported_usage: Usage | None = None
    other_models: dict[str, Usage] = Field(default_factory=dict)
    cli_cost_usd: float | None = None
    exit_reason: str = "completed"
    error: str | None = None
    returncode: int | None = None
    stderr_tail: str = ""
    structured: Any = None
    events_path: str | None = None
    wall_s: float = 0.0


class StreamParser(abc.ABC):
    """Turns a CLI's stdout JSONL lines into turns and trajectory events."""

    def __init__(self, on_turn: Callable[[CliTurn], None] | None = None,
                 on_event: Callable[[str, dict], None] | None = None):
        self.turns: list[CliTurn] = []
        self.on_turn = on_turn
        self.on_event = on_event
        self.final_text = ""
        self.error: str | None = None

    def emit(self, kind: str, data: dict) -> None:
        if self.on_event:
            self.on_event(kind, data)

    @abc.abstractmethod
    def feed(self, obj: dict) -> None:
        """One decoded stdout line."""

    def should_stop(self, budget: int | None) -> bool:
        """True when the turn budget is used up and the last turn's tools have answered."""
        return False

    def finish(self, res: SessionResult) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Fill ``res`` once the process ended (reconcile with native session files)."""


def kill_group(proc: subprocess.Popen, grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM the process group of ``proc``, then SIGKILL it after ``grace_s`` seconds."""
    if proc.poll() is not None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # stragglers of an exited leader
        except (ProcessLookupError, PermissionError):
            pass
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def agent_sandbox(argv: list[str], *, cwd: Path, env: dict[str, str],
                  config_dir: Path | None) -> tuple[list[str], dict[str, str]]:
    """``(command, launcher environment)`` of an agent CLI session in its sandbox: ``cwd`` (the
    workspace), ``config_dir`` and the workspace's request folder writable; the CLI's
    installation and the runtime read-only; ``HOME`` is the configuration directory; the
    network stays. Without a sandbox (loudly): ``argv`` and ``env`` unchanged."""
    writable = [str(cwd)] + ([str(config_dir)] if config_dir else [])
    try:
        writable.append(load_config(cwd).run_dir)
    except (FileNotFoundError, ValueError):
        pass
    inside = {**env, "HOME": str(config_dir or cwd)}
    policy = agent_policy(workspace=Path(cwd), extra_ro=installation_paths(argv[0]), extra_rw=writable[1:],
                          env=inside, share_net=True)
    if not bwrap.status().active:
        return list(argv), dict(env)
    return bwrap.wrap(argv, policy, env)


def run_cli(argv: list[str], *, cwd: Path, env: dict[str, str], prompt: str, parser: StreamParser,
            events_path: Path, timeout_s: float, budget_turns: int | None,
            poll: Callable[[], None] | None = None, config_dir: Path | None = None) -> SessionResult:
    """Run one CLI session to its end, its timeout or its turn budget.

    Args:
        argv: the command line.
        cwd: working directory (the workspace).
        env: the complete environment of the process.
        prompt: fed on stdin (from a file, so the CLI sees end of input).
        parser: consumes the stdout lines.
        events_path: where stdout is copied verbatim (JSONL).
        timeout_s: wall-clock limit in seconds.
        budget_turns: kill the session once the parser's turn count reaches it (None: no limit).
        poll: called every 0.2 s while the process runs (e.g. to tail a rollout file).
        config_dir: the session's configuration directory (writable inside the sandbox).

    Returns:
        A :class:`SessionResult` (turns, usage, exit reason...).

    Raises:
        BackendError: the binary cannot be started (``kind="config"``).
    """
    events_path.parent.mkdir(parents=True, exist_ok=True)
    prompt_file = events_path.with_suffix(".prompt.md")
    prompt_file.write_text(prompt)
    stderr_path = events_path.with_suffix(".stderr.log")
    t0 = time.monotonic()
    with open(prompt_file, "rb") as stdin, open(stderr_path, "wb") as stderr:
        try:
            cmd, launch_env = agent_sandbox(argv, cwd=cwd, env=env, config_dir=config_dir)
            proc = subprocess.Popen(cmd, cwd=cwd, env=launch_env, stdin=stdin, stdout=subprocess.PIPE, stderr=stderr,
                                    preexec_fn=new_group_dying_with_parent)
        except FileNotFoundError as e:
            raise BackendError(f"cannot start {argv[0]!r}: {e}", kind="config") from None
        lines: queue.Queue = queue.Queue()
        th = threading.Thread(target=_copy_stdout, args=(proc, events_path, lines), name="cli-stdout", daemon=True)
        th.start()
        reason, open_ = _watch(proc, lines, parser, poll, t0, timeout_s, budget_turns)
        kill_group(proc)  # the budget or the clock ran out, or reap helpers the CLI left behind
        th.join(timeout=10)
        while open_ and not lines.empty():
            open_ = _feed_parser(lines, parser, poll, 0.0)
        if poll:
            poll()
    return _session_result(proc, argv, events_path, stderr_path, parser, time.monotonic() - t0, reason, timeout_s,
                           budget_turns)


def _copy_stdout(proc: subprocess.Popen, events_path: Path, lines: queue.Queue) -> None:
    """Copy the CLI's stdout verbatim to ``events_path`` and queue its non-blank lines (bytes,
    stripped), then None once stdout has closed. Runs on a reader thread; parsing happens on the
    calling thread."""
    assert proc.stdout is not None
    with open(events_path, "ab") as raw:
        for line in proc.stdout:
            raw.write(line)
            raw.flush()
            if line.strip():
                lines.put(line.strip())
    lines.put(None)


def _feed_parser(lines: queue.Queue, parser: StreamParser, poll: Callable[[], None] | None, block_s: float) -> bool:
    """Feed queued lines to the parser (waiting up to ``block_s`` seconds for the first); False
    once stdout has closed. A line that is not JSON becomes an ``error`` event."""
    try:
        item = lines.get(timeout=block_s)
    except queue.Empty:
        return True
    while True:
        if item is None:
            return False
        try:
            obj = json.loads(item)
        except json.JSONDecodeError:
            parser.emit("error", {"message": "non-JSON line on the CLI's stdout",
                                  "line": item[:500].decode(errors="replace")})
        else:
            if isinstance(obj, dict):
                if poll:
                    poll()  # side files first (Codex's rollout), so events land on their turn
                parser.feed(obj)
        try:
            item = lines.get_nowait()
        except queue.Empty:
            return True


def _watch(proc: subprocess.Popen, lines: queue.Queue, parser: StreamParser, poll: Callable[[], None] | None,
           t0: float, timeout_s: float, budget_turns: int | None) -> tuple[str | None, bool]:
    """Feed the parser every 0.2 s until the process has exited and its stdout closed (or stayed
    open 5 s after the exit: a leftover child holds it), the turn budget is reached, or
    ``timeout_s`` seconds have passed since ``t0`` (``time.monotonic``). Returns ``(reason,
    stdout still open)``; ``reason`` is ``"budget"``, ``"timeout"`` or None (the process ended)."""
    open_, exited_at = True, None
    while True:
        if open_:
            open_ = _feed_parser(lines, parser, poll, 0.2)
        else:
            time.sleep(0.2)
        if poll:
            poll()
        if proc.poll() is not None:
            exited_at = exited_at or time.monotonic()
            # done once stdout closed (or a leftover child holds it open for long)
            if not open_ or time.monotonic() - exited_at > 5.0:
                return None, open_
        if budget_turns is not None and parser.should_stop(budget_turns):
            return "budget", open_
        if time.monotonic() - t0 > timeout_s:
            return "timeout", open_


def _session_result(proc: subprocess.Popen, argv: list[str], events_path: Path, stderr_path: Path,
                    parser: StreamParser, wall_s: float, reason: str | None, timeout_s: float,
                    budget_turns: int | None) -> SessionResult:
    """The :class:`SessionResult` of an ended session: the parser's turns, usage and final text,
    the stderr tail, and the exit reason (the budget or the clock, the agent's own error, or a
    non-zero exit status of the CLI)."""
    res = SessionResult(returncode=proc.returncode, events_path=str(events_path), wall_s=wall_s)
    res.stderr_tail = stderr_path.read_text(errors="replace")[-4000:] if stderr_path.exists() else ""
    parser.finish(res)
    res.turns = parser.turns
    res.usage = Usage.total(t.usage for t in parser.turns)
    res.text = res.text or parser.final_text
    if reason:
        res.exit_reason = reason
        res.error = res.error or (f"wall-clock limit of {timeout_s:.0f} s reached" if reason == "timeout"
                                  else f"turn budget of {budget_turns} reached")
    elif parser.error:
        res.exit_reason = "agent_error"
        res.error = parser.error
    elif proc.returncode != 0:
        res.exit_reason = "cli_error"
        res.error = f"{argv[0]} exited with status {proc.returncode}: {res.stderr_tail[-500:].strip()}"
    return res


def render_prompt(messages: list[dict]) -> str:
    """A conversation in the neutral format rendered as one prompt for a CLI."""
    if len(messages) == 1 and messages[0]["role"] == "user":
        return messages[0].get("content", "")
    parts = []
    for m in messages:
        if m["role"] == "tool":
            parts.append(f"[tool result {m.get('tool_call_id', '')}]\n{m.get('content', '')}")
        else:
            parts.append(f"[{m['role']}]\n{m.get('content', '')}")
    return "\n\n".join(parts)


class CliBackend(Backend):
    """Base of the agent-CLI backends.

    Options:
        binary: the executable (default: found on ``PATH``).
        timeout_s: wall-clock limit of a session (default 1800).
        api_key: passed to the CLI through its environment variable.
        extra_args: appended to the command line.
        env: extra environment variables.
        cwd: working directory of :meth:`complete` sessions (default: a fresh empty folder).
    """

    is_cli = True
    binary_name = ""

    def __init__(self, model: str, base_url: str | None = None, *, binary: str | None = None,
                 timeout_s: float = 1800.0, api_key: str | None = None, extra_args: list[str] | None = None,
                 env: dict[str, str] | None = None, cwd: str | Path | None = None, **kw):
        super().__init__(model, base_url, **kw)
        found = binary or shutil.which(self.binary_name)
        if not found:
            raise BackendError(f"the {self.name} backend needs the {self.binary_name!r} CLI on PATH "
                               f"(install: bash .ci/install-agent-clis.sh)", kind="config")
        self.binary = found
        self.timeout_s = timeout_s
        self.api_key = api_key
        self.extra_args = list(extra_args or [])
        self.extra_env = dict(env or {})
        self.cwd = Path(cwd) if cwd else None

    def version(self) -> str:
        """The CLI's ``--version`` output."""
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True, timeout=60)
        return out.stdout.strip()

    @abc.abstractmethod
    def run_session(self, prompt: str, *, cwd: Path, config_dir: Path, events_path: Path,
                    budget_turns: int | None = None, timeout_s: float | None = None, system: str | None = None,
                    mcp_servers: dict | None = None, json_schema: dict | None = None,
                    on_turn: Callable[[CliTurn], None] | None = None,
                    on_event: Callable[[str, dict], None] | None = None) -> SessionResult:
        """Run the CLI as an agent on ``prompt`` in ``cwd``.

        Args:
            prompt: the task prompt (fed on stdin).
            cwd: the workspace.
            config_dir: the private configuration directory of this session (created).
            events_path: where the raw stdout JSONL goes.
            budget_turns: the turn budget (model responses), enforced by killing the process group.
            timeout_s: wall-clock limit (default: the backend's ``timeout_s``).
            system: text appended to the CLI's system prompt.
            mcp_servers: ``{name: {"command": str, "args": [...], "env": {...}}}`` stdio MCP servers.
            json_schema: ask for a final structured answer of this schema.
            on_turn: called with each new turn as it is first seen.
            on_event: called with trajectory events (``tool_call``, ``tool_result``, ``message``, ``error``).

        Raises:
            BackendError: the CLI cannot be started.
        """

    def complete(self, messages: list[dict], *, system: str | None = None, tools: list[dict] | None = None,
                 json_schema: dict | None = None, max_tokens: int = 4096) -> Completion:
        """One CLI session on the rendered conversation (see :meth:`Backend.complete`).

        The CLI uses its own tools, so ``tools`` must be None; ``max_tokens`` is not enforced by
        the CLIs. ``Completion.turns`` is the number of model responses of the session.

        Raises:
            ValueError: ``tools`` given.
            BackendError: the session failed (timeout, CLI error).
            MalformedOutputError: ``json_schema`` given and the answer is not JSON.
        """
        if tools:
            raise ValueError(f"the {self.name} backend runs its own tools; pass tools=None")
        with tempfile.TemporaryDirectory(prefix=f"d2k-{self.name}-") as tmp:
            tmp_p = Path(tmp)
            cwd = self.cwd or (tmp_p / "work")
            cwd.mkdir(parents=True, exist_ok=True)
            events_path = tmp_p / "events.jsonl"
            res = self.run_session(render_prompt(messages), cwd=cwd, config_dir=tmp_p / "config",
                                   events_path=events_path, system=system, json_schema=json_schema)
            raw_events = [json.loads(x) for x in Path(res.events_path or events_path).read_text().splitlines()
                          if x.strip()]
        if res.exit_reason not in ("completed",):
            raise BackendError(f"{self.name} session failed ({res.exit_reason}): {res.error}", kind="cli")
        comp = Completion(text=res.text, usage=res.usage, raw={"events": raw_events, "session": res.model_dump()},
                          model=self.model, stop_reason=res.exit_reason, turns=len(res.turns),
                          cli_cost_usd=res.cli_cost_usd, provider=self.name)
        if json_schema is not None:
            comp.parsed = res.structured if res.structured is not None else parse_json_text(res.text)
            comp.text = json.dumps(comp.parsed)
        return comp


def base_env(extra: dict[str, str]) -> dict[str, str]:
    """The parent environment without variables that would redirect or authorise a CLI
    elsewhere than configured, plus ``extra``."""
    drop = ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_MODEL",
            "CLAUDE_CONFIG_DIR", "CODEX_HOME", "OPENAI_BASE_URL", "CLAUDECODE", "CLAUDE_CODE_ENTRYPOINT")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra)
    return env
