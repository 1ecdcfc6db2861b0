"""Regenerate the example outputs of README.md from the commands they show.

Each example in README.md sits between ``<!-- example: NAME -->`` and ``<!-- /example -->`` as a
``text`` code block whose first line is ``$ COMMAND``. This script runs every command (CPU, 130
columns), and writes its real output into the block:

    PYTHONPATH=src python devtools/readme_examples.py            # rewrite README.md
    PYTHONPATH=src python devtools/readme_examples.py --check    # exit 1 if a block differs

``tests/test_readme.py`` fails when a block no longer matches what the command prints: exactly
for the deterministic commands, by structure (columns, workloads, statuses, the summary lines)
for the timed ``d2k eval``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCK = re.compile(r"(<!-- example: (?P<name>[\w-]+) -->\n```text\n)(?P<body>.*?)(```\n<!-- /example -->)", re.S)
WIDTH = "130"


def blocks(text: str) -> dict[str, str]:
    """Example name -> block body (the ``$ command`` line and the output)."""
    return {m["name"]: m["body"] for m in BLOCK.finditer(text)}


def command_of(body: str) -> str:
    """The command of a block (its first line without the ``$ ``; continuation lines joined)."""
    lines = body.splitlines()
    cmd = lines[0][2:]
    i = 1
    while cmd.endswith("\\") and i < len(lines):
        cmd = cmd[:-1].rstrip() + " " + lines[i].strip()
        i += 1
    return cmd


def run(command: str) -> str:
    """What ``command`` (a ``d2k ...`` line) prints, on the CPU, at the README's width."""
    argv = shlex.split(command)
    if argv[0] != "d2k":
        raise ValueError(f"README examples run d2k commands, not {argv[0]!r}")
    env = {**os.environ, "COLUMNS": WIDTH, "TERM": "dumb", "D2K_STORE": "d2k.sqlite"}
    p = subprocess.run([sys.executable, "-m", "d2kbench.cli", *argv[1:]], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=1800)
    return p.stdout.rstrip() + "\n"


def command_lines(body: str) -> list[str]:
    """The ``$ command`` line and its continuation lines, as written."""
    out = []
    for line in body.splitlines():
        out.append(line)
        if not line.rstrip().endswith("\\"):
            break
    return out


def rendered(body: str) -> str:
    """The block body as the command prints it now."""
    return "\n".join(command_lines(body)) + "\n" + run(command_of(body))


def main(argv: list[str]) -> int:
    text = README.read_text()
    new = BLOCK.sub(lambda m: m.group(1) + rendered(m["body"]) + m.group(4), text)
    if "--check" in argv:
        if new != text:
            print("README.md examples differ from what their commands print now", file=sys.stderr)
            return 1
        return 0
    README.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
