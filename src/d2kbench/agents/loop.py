"""The built-in tool-calling loop for API backends (``openai``, ``anthropic``).

One iteration = one model response = one turn: call the model with the tools, record the
turn's usage, run the requested tools in the workspace, append their results, repeat until the
model answers without a tool call, the turn budget is used up or the wall-clock limit passes.
Retries of 429 / 5xx / 529 happen inside the backend and are not turns. A malformed response
(unparseable body) is recorded as an ``error`` event and asked again, not counted, up to
``max_malformed`` times in a row, after which the run ends with ``exit_reason="provider_error"``;
a tool call whose arguments are not JSON is answered with an error result (the response did
count as a turn).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from d2kbench.agents.backends.base import Backend, BackendError, MalformedOutputError, ToolCall
from d2kbench.agents.dispatch import run_tool
from d2kbench.agents.tools import ToolOutput, clip
from d2kbench.agents.workspace import load_config
from d2kbench.sandbox import bwrap
from d2kbench.sandbox.policy import agent_policy, sandbox_env

#: Seconds a ``bash`` tool call may run by default, and at most.
BASH_TIMEOUT_S, BASH_TIMEOUT_MAX_S = 600, 3600

TOOLS: list[dict] = [
    {"name": "bash", "description": "Run a shell command in the workspace (bash -c). Returns exit status and output.",
     "parameters": {"type": "object", "properties": {
         "command": {"type": "string"},
         "timeout_s": {"type": "integer", "description": f"seconds (default {BASH_TIMEOUT_S})"}},
         "required": ["command"]}},
    {"name": "read_file", "description": "Read a text file of the workspace, with line numbers.",
     "parameters": {"type": "object", "properties": {
         "path": {"type": "string"}, "offset": {"type": "integer", "description": "first line (1-based)"},
         "limit": {"type": "integer", "description": "number of lines"}}, "required": ["path"]}},
    {"name": "write_file", "description": "Create or overwrite a file of the workspace.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                    "required": ["path", "content"]}},
    {"name": "edit_file", "description": "Replace one exact, unique occurrence of old_str by new_str in a file.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "old_str": {"type": "string"},
                                                     "new_str": {"type": "string"}},
                    "required": ["path", "old_str", "new_str"]}},
    {"name": "test", "description": "Correctness of solution.py on every workload (no timing).",
     "parameters": {"type": "object", "properties": {}}},
    {"name": "bench", "description": "Latency and speedup of solution.py per workload against the baseline.",
     "parameters": {"type": "object", "properties": {}}},
    {"name": "profile", "description": "Profiler summary of solution.py on one workload.",
     "parameters": {"type": "object", "properties": {"workload": {"type": "string"}}}},
    {"name": "submit", "description": "Snapshot solution.py as a candidate and evaluate it; the final answer is the "
                                      "fully correct candidate with the highest geomean speedup.",
     "parameters": {"type": "object", "properties": {"note": {"type": "string"}}}},
]


class LoopResult(BaseModel):
    """How the loop ended: ``exit_reason`` in completed | budget | timeout | provider_error."""

    turns: int
    exit_reason: str
    error: str | None = None
    final_text: str = ""


class Toolbox:
    """Executes the built-in loop's tools inside one workspace.

    Args:
        workspace: the workspace directory (file tools may not leave it).
        submit: called as ``submit(note, turn)`` for the submit tool (the runner snapshots and
            evaluates); default: the workspace's own submit tool.
    """

    def __init__(self, workspace: Path, submit: Callable[[str, int], ToolOutput] | None = None):
        self.ws = Path(workspace).resolve()
        self._submit = submit

    def _path(self, rel: str) -> Path:
        p = (self.ws / rel).resolve()
        if p != self.ws and self.ws not in p.parents:
            raise ValueError(f"path {rel!r} is outside the workspace")
        return p

    def call(self, tc: ToolCall, turn: int) -> ToolOutput:
        """Run one tool call; never raises (errors come back as ``ok=False`` text)."""
        a = tc.arguments
        try:
            if tc.name == "bash":
                return self.bash(str(a["command"]), int(a.get("timeout_s") or BASH_TIMEOUT_S))
            if tc.name == "read_file":
                lines = self._path(a["path"]).read_text(errors="replace").splitlines()
                start = max(1, int(a.get("offset") or 1))
                stop = start - 1 + int(a.get("limit") or 2000)
                body = "\n".join(f"{i:6d}\t{line}" for i, line in enumerate(lines[start - 1:stop], start))
                return ToolOutput(text=clip(body or "(empty file)"))
            if tc.name == "write_file":
                p = self._path(a["path"])
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(a["content"])
                return ToolOutput(text=f"wrote {p.relative_to(self.ws)} ({len(a['content'])} characters)")
            if tc.name == "edit_file":
                p = self._path(a["path"])
                text = p.read_text()
                n = text.count(a["old_str"])
                if n != 1:
                    return ToolOutput(text=f"edit_file: old_str occurs {n} times in {a['path']} (must be exactly once)",
                                      ok=False, is_error=True)
                p.write_text(text.replace(a["old_str"], a["new_str"]))
                return ToolOutput(text=f"edited {p.relative_to(self.ws)}")
            if tc.name == "submit" and self._submit is not None:
                return self._submit(str(a.get("note") or ""), turn)
            if tc.name in ("test", "bench", "profile", "submit"):
                return run_tool(self.ws, tc.name, a, turn=turn, source="builtin")
            return ToolOutput(text=f"unknown tool {tc.name!r}; tools: {', '.join(t['name'] for t in TOOLS)}", ok=False,
                              is_error=True)
        except KeyError as e:
            return ToolOutput(text=f"{tc.name}: missing argument {e}", ok=False, is_error=True)
        except (OSError, ValueError, TypeError) as e:
            return ToolOutput(text=f"{tc.name}: {type(e).__name__}: {e}", ok=False, is_error=True)

    def bash(self, command: str, timeout_s: int) -> ToolOutput:
        """Run ``command`` with bash in the workspace, inside the agent's OS sandbox (the
        workspace and its request folder writable, the runtime read-only, no network, nothing
        of the suite or the store)."""
        timeout_s = max(1, min(timeout_s, BASH_TIMEOUT_MAX_S))
        try:
            extra_rw = [load_config(self.ws).run_dir]
        except (FileNotFoundError, ValueError):
            extra_rw = []
        policy = agent_policy(workspace=self.ws, extra_rw=extra_rw, env=sandbox_env(str(self.ws)))
        cmd, env = bwrap.wrap(["bash", "-c", command], policy)
        proc = subprocess.Popen(cmd, cwd=self.ws, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout_s)
            status = f"exit status {proc.returncode}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            status = f"killed after {timeout_s} s"
        return ToolOutput(text=clip(f"[{status}]\n" + out.decode(errors="replace")), ok=proc.returncode == 0)


def run_loop(backend: Backend, toolbox: Toolbox, *, system: str, prompt: str, budget_turns: int,
             wall_clock_s: float | None, on_turn: Callable, on_event: Callable[[int, str, dict], None],
             max_tokens: int = 16384, max_malformed: int = 3) -> LoopResult:
    """Drive ``backend`` as a tool-using agent in the toolbox's workspace.

    Args:
        backend: an API backend.
        toolbox: executes tool calls.
        system: the system prompt (the brief).
        prompt: the first user message.
        budget_turns: most model responses.
        wall_clock_s: wall-clock limit in seconds (checked between turns), or None.
        on_turn: called as ``on_turn(turn, completion)`` after each response (1-based turn).
        on_event: called as ``on_event(turn, kind, data)`` for trajectory events.
        max_tokens: per response.
        max_malformed: consecutive malformed responses tolerated.

    Returns:
        A :class:`LoopResult`; provider failures end the loop (``provider_error``), never raise.
    """
    messages: list[dict] = [{"role": "user", "content": prompt}]
    on_event(0, "message", {"role": "user", "content": prompt})
    t0 = time.monotonic()
    turn, malformed, final = 0, 0, ""
    while True:
        if turn >= budget_turns:
            return LoopResult(turns=turn, exit_reason="budget", final_text=final)
        if wall_clock_s is not None and time.monotonic() - t0 > wall_clock_s:
            return LoopResult(turns=turn, exit_reason="timeout", final_text=final,
                              error=f"wall-clock limit of {wall_clock_s:.0f} s reached")
        try:
            comp = backend.complete(messages, system=system, tools=TOOLS, max_tokens=max_tokens)
        except MalformedOutputError as e:
            malformed += 1
            on_event(turn, "error", {"kind": "malformed", "message": str(e), "attempt": malformed})
            if malformed >= max_malformed:
                return LoopResult(turns=turn, exit_reason="provider_error", final_text=final,
                                  error=f"{malformed} malformed responses in a row; last: {e}")
            continue
        except BackendError as e:
            on_event(turn, "error", {"kind": e.kind, "status": e.status, "message": str(e)})
            return LoopResult(turns=turn, exit_reason="provider_error", error=str(e), final_text=final)
        malformed = 0
        turn += 1
        for k, err in enumerate(comp.retry_errors):
            on_event(turn, "retry", {"attempt": k + 1, "error": err})
        on_turn(turn, comp)
        msg = comp.message()
        messages.append(msg)
        on_event(turn, "message", {"role": "assistant", "content": comp.text, "stop_reason": comp.stop_reason,
                                   "tool_calls": [tc.model_dump(exclude_none=True) for tc in comp.tool_calls]})
        final = comp.text or final
        if not comp.tool_calls:
            return LoopResult(turns=turn, exit_reason="completed", final_text=final)
        for tc in comp.tool_calls:
            on_event(turn, "tool_call", tc.model_dump(exclude_none=True))
            if tc.arguments_error:
                out = ToolOutput(text=f"error: {tc.arguments_error}. Call the tool again with a JSON object.",
                                 ok=False, is_error=True)
            else:
                out = toolbox.call(tc, turn)
            on_event(turn, "tool_result", {"tool_call_id": tc.id, "name": tc.name, "ok": out.ok,
                                           "content": out.text[:4000], "data": out.data})
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": out.text, "is_error": out.is_error})
