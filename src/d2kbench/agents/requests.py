"""Tool requests: how a sandboxed agent's ``test``, ``bench`` and ``profile`` reach the trusted
evaluator (``submit`` has its own queue, :mod:`d2kbench.agents.submissions`).

An agent runs in an OS sandbox that holds its workspace and none of the suite (no expert, no
rubric, no other task, no store), so it cannot run the harness itself. A tool call in the
sandbox (the ``tools/<name>`` command or the MCP server) snapshots ``solution.py`` into
``RUN_DIR/tool-requests/NNN-<sha12>.py``, writes ``NNN.request.json`` (the tool, the workload)
and waits for ``NNN.result.json``. The runner, outside the sandbox, answers each request with
the harness (whose workers are sandboxed too) and writes the result. Request files are the
agent's: the runner trusts nothing in them but the snapshot's content, which it hashes itself.
"""

from __future__ import annotations

import hashlib
import time
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel

from d2kbench.agents.tools import ToolOutput, run_local
from d2kbench.agents.workspace import WorkspaceConfig, locked_dir

#: The tools that go through this queue.
REQUEST_TOOLS = ("test", "bench", "profile")


class ToolRequest(BaseModel):
    """One tool call of a sandboxed agent: its number, the tool, the snapshot and its hash."""

    n: int
    tool: str
    sha256: str
    snapshot: str
    workload: str | None = None
    created_at: str


def request_dir(cfg: WorkspaceConfig) -> Path:
    return Path(cfg.run_dir) / "tool-requests"


def result_path(cfg: WorkspaceConfig, n: int) -> Path:
    return request_dir(cfg) / f"{n:03d}.result.json"


def place_request(workspace: Path, cfg: WorkspaceConfig, tool: str, workload: str | None = None) -> ToolRequest:
    """Snapshot ``solution.py`` and write the request (the agent's side).

    Raises:
        FileNotFoundError: no ``solution.py``.
        ValueError: not a queued tool.
    """
    if tool not in REQUEST_TOOLS:
        raise ValueError(f"{tool!r} is not a queued tool ({', '.join(REQUEST_TOOLS)})")
    sol = Path(workspace) / "solution.py"
    if not sol.is_file():
        raise FileNotFoundError(f"{sol} does not exist: write your solution there first")
    folder = request_dir(cfg)
    with locked_dir(folder):
        n = len(list(folder.glob("*.request.json"))) + 1
        data = sol.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        snap = folder / f"{n:03d}-{sha[:12]}.py"
        snap.write_bytes(data)
        req = ToolRequest(n=n, tool=tool, sha256=sha, snapshot=str(snap), workload=workload,
                          created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        tmp = folder / f"{n:03d}.request.tmp"
        tmp.write_text(req.model_dump_json(indent=1))
        tmp.replace(folder / f"{n:03d}.request.json")
    return req


def request_tool(workspace: Path, cfg: WorkspaceConfig, tool: str, workload: str | None = None,
                 poll_s: float = 0.25):
    """Place a request and wait for the runner's answer (a :class:`ToolOutput`)."""
    req = place_request(workspace, cfg, tool, workload)
    deadline = time.monotonic() + cfg.submit_timeout_s
    p = result_path(cfg, req.n)
    while time.monotonic() < deadline:
        if p.is_file():
            return ToolOutput.model_validate_json(p.read_text())
        time.sleep(poll_s)
    return ToolOutput(text=f"{tool}: the evaluator did not answer within {cfg.submit_timeout_s:.0f} s", ok=False,
                      is_error=True)


def pending(cfg: WorkspaceConfig, answered: set[int]) -> list[ToolRequest]:
    """Requests without a result, oldest first (the runner's side)."""
    folder = request_dir(cfg)
    out = []
    for f in sorted(folder.glob("*.request.json")) if folder.is_dir() else []:
        try:
            req = ToolRequest.model_validate_json(f.read_text())
        except ValueError:
            continue
        if req.n not in answered and not result_path(cfg, req.n).is_file():
            out.append(req)
    return out


def answer(cfg: WorkspaceConfig, req: ToolRequest):
    """Run the requested tool on the request's snapshot in this (trusted) process and write the
    result; returns the :class:`ToolOutput`. A snapshot that is not the one the tool wrote,
    or whose content changed, is refused."""
    snap = Path(req.snapshot)
    folder = request_dir(cfg).resolve()
    if req.tool not in REQUEST_TOOLS:
        out = ToolOutput(text=f"unknown tool {req.tool!r}", ok=False, is_error=True)
    elif snap.resolve().parent != folder or not snap.name.startswith(f"{req.n:03d}-{req.sha256[:12]}") \
            or not snap.is_file() or hashlib.sha256(snap.read_bytes()).hexdigest() != req.sha256:
        out = ToolOutput(text=f"{req.tool}: request {req.n} refused: its snapshot is not the one the tool wrote",
                         ok=False, is_error=True)
    else:
        out = run_local(cfg, req.tool, snap, {"workload": req.workload})
    p = result_path(cfg, req.n)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(out.model_dump_json(indent=1))
    tmp.replace(p)
    return out
