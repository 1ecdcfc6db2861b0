"""Scripts for the fake provider that play an agent on the Muon task, and their solutions.

The *correct* candidate is an independent one-kernel Triton Muon for the smoke shapes (the evil
suite's honest helper, ``evil/muon_newton_schulz/_tiny_muon.py``, with a ``run``): the task's
own solutions are held back, and a candidate that reproduces one is excluded from scores. The
*incorrect* one is the same code with four Polar Express steps instead of five (its error
exceeds the tolerance).
"""

from __future__ import annotations

from d2kbench.agents.workspace import EvalSettings
from d2kbench.harness.evil import EVIL_DIR

TASK = "muon_newton_schulz"
#: One smoke workload, one correctness call, one CPU timing sample: a candidate takes seconds.
FAST_EVAL = EvalSettings(workloads=["smoke_wide_2x32x96"], check_calls=1, cpu_samples=1)


def correct_solution() -> str:
    helper = (EVIL_DIR / "muon_newton_schulz" / "_tiny_muon.py").read_text()
    return helper + "\n\ndef run(G, steps=5):\n    return muon(G, steps=5)\n"


def incorrect_solution() -> str:
    text = correct_solution()
    assert "return muon(G, steps=5)" in text
    return text.replace("return muon(G, steps=5)", "return muon(G, steps=4)")


def usage(i: int, o: int, cr: int = 0, w5: int = 0, w1: int = 0) -> dict:
    return {"input_tokens": i, "output_tokens": o, "cache_read": cr, "cache_write_5m": w5, "cache_write_1h": w1}


def builtin_script(model: str = "gpt-5") -> dict:
    """The built-in loop's scripted run: write a wrong solution, test it, submit it, write the
    right one, submit it, stop; with a 429 and a 529 on the way (retried, not turns)."""
    return {"models": [model], "steps": [
        {"text": "Writing a first version.", "tool_calls": [
            {"name": "write_file", "arguments": {"path": "solution.py", "content": incorrect_solution()}}],
         "usage": usage(1000, 200, 0, 800, 0)},
        {"error": 429, "retry_after": 0.01},
        {"tool_calls": [{"name": "test", "arguments": {}}], "usage": usage(300, 20, 1800, 0, 100)},
        {"tool_calls": [{"name": "submit", "arguments": {"note": "first try"}}], "usage": usage(400, 30, 2000, 0, 0)},
        {"error": 529},
        {"text": "Fixing the step count.", "tool_calls": [
            {"name": "write_file", "arguments": {"path": "solution.py", "content": correct_solution()}}],
         "usage": usage(500, 2000, 2400, 0, 0)},
        {"tool_calls": [{"name": "submit", "arguments": {"note": "five steps"}}], "usage": usage(200, 25, 4500, 0, 0)},
        {"text": "Done: submitted a correct candidate.", "usage": usage(100, 10, 4800, 0, 0)},
    ]}


def heredoc(path: str, text: str) -> str:
    """A shell command that writes ``text`` to ``path``."""
    assert "D2K_EOF" not in text
    return f"cat > {path} <<'D2K_EOF'\n{text}D2K_EOF\n"


def claude_script(model: str = "claude-sonnet-4-6") -> dict:
    """Claude Code's scripted run: write the solution with Bash, (a 529, retried by the CLI),
    test it through MCP, submit it with the workspace's command, stop. Usage per response is explicit (the CLI's stream shows
    partial output counts; the session file has these)."""
    return {"models": [model], "steps": [
        {"text": "Writing the solution.", "tool_calls": [
            {"name": "Bash", "arguments": {"command": heredoc("solution.py", correct_solution()),
                                           "description": "write solution"}}],
         "usage": usage(3000, 2100, 0, 9000, 0)},
        {"error": 529},  # Claude Code retries it itself: not a turn
        {"tool_calls": [{"name": "mcp__d2k__test", "arguments": {}}], "usage": usage(200, 30, 12000, 0, 500)},
        {"tool_calls": [{"name": "Bash", "arguments": {"command": "tools/submit --note via-cli",
                                                        "description": "submit"}}],
         "usage": usage(300, 40, 12500, 0, 0)},
        {"text": "Submitted a correct candidate.", "usage": usage(100, 12, 13000, 0, 0)},
    ]}


def codex_script(model: str = "gpt-5.5") -> dict:
    """Codex's scripted run: write the solution with exec_command, (a 500, retried by the CLI),
    test it with the workspace's command, submit it through MCP (a namespaced tool), stop."""
    return {"models": [model], "steps": [
        {"tool_calls": [{"name": "exec_command", "arguments": {"cmd": heredoc("solution.py", correct_solution())}}],
         "usage": usage(2000, 2100, 0)},
        {"error": 500},  # Codex retries it itself (it gives up on a 429): not a turn
        {"tool_calls": [{"name": "exec_command", "arguments": {"cmd": "tools/test"}}], "usage": usage(500, 20, 4000)},
        {"tool_calls": [{"name": "submit", "namespace": "mcp__d2k", "arguments": {"note": "via-mcp"}}],
         "usage": usage(400, 30, 4600)},
        {"text": "Submitted a correct candidate.", "usage": usage(100, 10, 5200)},
    ]}
