"""``python -m d2kbench.agents.mcp_server --workspace DIR``: the agent tools over MCP (stdio).

Built on the official ``mcp`` SDK (``MCPServer``). Tools: ``test``, ``bench``,
``profile(workload)``, ``submit(note)``; each answers with the same text as the matching
``tools/<name>`` command. Claude Code sees them as ``mcp__d2k__<tool>``.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

# Imports inside functions: an entry point started for every agent session: the MCP SDK and the tools load in main().


def build_server(workspace: Path):
    """An ``MCPServer`` exposing the four tools of ``workspace``.

    Raises:
        ImportError: the ``mcp`` package (extra ``agents``) is not installed.
    """
    from mcp.server.mcpserver import MCPServer

    from d2kbench.agents.dispatch import run_tool

    ws = Path(workspace).resolve()
    server = MCPServer(name="d2k", instructions="D2K-Bench tools for this workspace: test, bench, profile, submit. "
                                                "See CLAUDE.md / AGENTS.md.")

    async def call(name: str, args: dict) -> str:
        out = await asyncio.to_thread(run_tool, ws, name, args, source="mcp")
        return out.text

    @server.tool(name="test", description="Check solution.py for correctness on every workload (no timing).")
    async def test() -> str:
        return await call("test", {})

    @server.tool(name="bench", description="Check and time solution.py on every workload; speedup vs the baseline.")
    async def bench() -> str:
        return await call("bench", {})

    @server.tool(name="profile", description="Profiler summary (kernel table) of solution.py on one workload.")
    async def profile(workload: str = "") -> str:
        return await call("profile", {"workload": workload or None})

    @server.tool(name="submit", description="Snapshot solution.py as a candidate and evaluate it. The final answer "
                                            "is the fully correct candidate with the highest geomean speedup.")
    async def submit(note: str = "") -> str:
        return await call("submit", {"note": note})

    return server


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m d2kbench.agents.mcp_server")
    ap.add_argument("--workspace", required=True)
    a = ap.parse_args(argv)
    build_server(Path(a.workspace)).run("stdio")


if __name__ == "__main__":
    main()
