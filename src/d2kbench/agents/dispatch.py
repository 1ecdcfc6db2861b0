"""One entry point for the agent tools (:func:`run_tool`), shared by the tool CLI, the MCP
server and the built-in loop: ``submit`` goes to :mod:`d2kbench.agents.submissions`; ``test``,
``bench`` and ``profile`` run here (:func:`d2kbench.agents.tools.run_local`), or, for a
sandboxed agent, as requests the runner answers outside the sandbox
(:mod:`d2kbench.agents.requests`).
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

from d2kbench.agents.requests import request_tool
from d2kbench.agents.submissions import submit
from d2kbench.agents.tools import ToolOutput, clip, run_local
from d2kbench.agents.workspace import load_config


def tool_submit(workspace: Path, note: str = "", turn: int | None = None, source: str = "cli") -> ToolOutput:
    """Snapshot and evaluate ``solution.py`` as a candidate (see :mod:`d2kbench.agents.submissions`)."""
    res = submit(Path(workspace), note=note, turn=turn, source=source)
    return ToolOutput(text=clip(res.text), ok=res.status == "evaluated" and bool(res.eligible),
                      data=res.model_dump(exclude={"text"}))


def run_tool(workspace: str | Path, name: str, args: dict | None = None, *, turn: int | None = None,
             source: str = "cli") -> ToolOutput:
    """Run tool ``name`` (``test``, ``bench``, ``profile``, ``submit``) on a workspace.

    Never raises for solution failures or tool errors: a tool that crashes answers with
    ``ok=False`` and the error text.

    Raises:
        ValueError: unknown tool name.
    """
    args = dict(args or {})
    ws = Path(workspace).resolve()
    if name not in ("test", "bench", "profile", "submit"):
        raise ValueError(f"unknown tool {name!r} (test, bench, profile, submit)")

    def call() -> ToolOutput:
        if name == "submit":
            return tool_submit(ws, note=str(args.get("note") or ""), turn=turn, source=source)
        cfg = load_config(ws)
        if cfg.runner and source != "builtin":  # a sandboxed agent: the runner evaluates, outside
            return request_tool(ws, cfg, name, args.get("workload"))
        return run_local(cfg, name, ws / "solution.py", args)

    try:
        return call()
    except Exception as e:  # noqa: BLE001 - reported to the agent, never a crash of the run
        tb = traceback.format_exc(limit=4)
        print(tb, file=sys.stderr)
        return ToolOutput(text=f"{name}: tool error: {type(e).__name__}: {e}", ok=False, is_error=True,
                          data={"error": f"{type(e).__name__}: {e}"})
