"""The README's example outputs are what their commands print (regenerate them with
``PYTHONPATH=src python devtools/readme_examples.py``)."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

from d2kbench.harness.summary import COLUMNS
from d2kbench.tasks import load_task

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("readme_examples", ROOT / "devtools" / "readme_examples.py")
ex = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ex)
BLOCKS = ex.blocks((ROOT / "README.md").read_text())


def _output(name: str) -> list[str]:
    body = BLOCKS[name]
    return body.splitlines()[len(ex.command_lines(body)):]


def test_the_readme_has_its_examples():
    assert {"tasks", "validate", "eval"} <= set(BLOCKS)


def test_the_task_table_is_what_d2k_tasks_prints():
    assert "\n".join(_output("tasks")) + "\n" == ex.run(ex.command_of(BLOCKS["tasks"]))


def test_the_validate_example_lists_its_tasks():
    argv = shlex.split(ex.command_of(BLOCKS["validate"]))
    assert _output("validate") == [f"ok   {t}" for t in argv[2:]]


def test_the_eval_example_has_the_columns_workloads_and_summary_of_today():
    argv = shlex.split(ex.command_of(BLOCKS["eval"]))
    task = load_task(argv[2])
    wanted = [argv[i + 1] for i, a in enumerate(argv) if a in ("-w", "--workload")]
    text = "\n".join(_output("eval"))
    header = next(line for line in text.splitlines() if line.startswith("┃"))
    assert [c.strip() for c in header.strip("┃").split("┃")] == list(COLUMNS)
    rows = [line for line in text.splitlines() if line.startswith("│")]
    assert [r.split("│")[1].strip() for r in rows] == wanted
    assert all(r.split("│")[2].strip() == "ok" for r in rows)
    assert all(w in {x.id for x in task.spec.smoke_workloads} for w in wanted)
    assert re.search(rf"^{task.id}: geomean speedup [0-9.]+x over reference \({argv[3]}\)$", text, re.M)
    assert re.search(r"^harness: wall [0-9.]+ s, timed calls [0-9.]+ s, overhead", text, re.M)


def test_ci_runs_the_readme_test_command_and_the_slow_tier_it_leaves_out():
    """CI calls the README's test command (the first tier) and then the ``slow`` tier, so every
    test runs in CI and a newcomer's command is the one CI proves."""
    readme = [ln.strip() for ln in (ROOT / "README.md").read_text().splitlines()]
    commands = [ln for ln in readme if ln.startswith("python -m pytest")]
    assert len(commands) == 2 and '-m "not slow"' in commands[0], commands
    assert commands[1] == commands[0].replace('-m "not slow"', "-m slow"), commands
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines() if not ln.lstrip().startswith("#")]
    assert [ln for ln in ci if ln.startswith("python -m pytest")] == commands, ci
