"""``python -m d2kbench.agents.tool_cli TOOL --workspace DIR``: the agent tools as commands.

The workspace's ``tools/<name>`` scripts call this (``d2k agent-tool`` is the same through the
main CLI). Prints the tool's text; exits 0 when the tool answered ``ok``, 1 otherwise, 2 on
bad usage.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from d2kbench.agents.workspace import TOOL_NAMES

# Imports inside functions: an entry point run for every tool call of a sandboxed agent: it must start fast.


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="d2k agent-tool", description="D2K-Bench agent tools")
    ap.add_argument("tool", choices=TOOL_NAMES)
    ap.add_argument("--workspace", default=".", help="the workspace directory (default: .)")
    ap.add_argument("--note", default="", help="submit: a short note on this candidate")
    ap.add_argument("--workload", default=None, help="profile: the workload id (default: the first timed one)")
    a = ap.parse_args(argv)
    from d2kbench.agents.dispatch import run_tool

    try:
        out = run_tool(Path(a.workspace), a.tool, {"note": a.note, "workload": a.workload})
    except FileNotFoundError as e:
        print(str(e), file=sys.stderr)
        return 2
    print(out.text)
    return 0 if out.ok else 1


if __name__ == "__main__":
    sys.exit(main())
