"""CLI smoke tests through typer's runner (real commands, real harness)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import rich.errors
from conftest import SOLUTIONS
from rich.console import Console
from typer.testing import CliRunner

from d2kbench.cli import app
from d2kbench.store import Store
from d2kbench.terminal import print_error

runner = CliRunner()


def test_tasks_and_show():
    r = runner.invoke(app, ["tasks"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "muon_newton_schulz" in r.output and "events" in r.output
    r = runner.invoke(app, ["show", "muon_newton_schulz"], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert "paper_8x7168x18432" in r.output and "tensor_core" in r.output and "solutions/straightforward.py" in r.output


def test_show_unknown_task():
    r = runner.invoke(app, ["show", "nope"])
    assert r.exit_code == 2 and "no such task" in r.output


def test_show_and_eval_name_a_negative_axis(tmp_path):
    import shutil

    import yaml

    from d2kbench.tasks import load_task

    root = tmp_path / "muon_newton_schulz"
    shutil.copytree(load_task("muon_newton_schulz").root, root, ignore=shutil.ignore_patterns("__pycache__"))
    data = yaml.safe_load((root / "task.yaml").read_text())
    data["smoke_workloads"][1]["axes"]["N"] = -48
    (root / "task.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    for args in (["show", str(root)], ["eval", str(root), "straightforward", "--device", "cpu"]):
        r = runner.invoke(app, args, env={"COLUMNS": "250"})
        assert r.exit_code == 2, r.output
        assert "workload 'smoke_tall_1x64x48': axis 'N' = -48" in r.output and "Traceback" not in r.output


def test_validate():
    r = runner.invoke(app, ["validate", "--no-smoke"])
    assert r.exit_code == 0 and "ok" in r.output


def test_eval_writes_json_markdown_and_store(tmp_path):
    store, js, md = tmp_path / "s.sqlite", tmp_path / "e.json", tmp_path / "e.md"
    r = runner.invoke(app, ["eval", "muon_newton_schulz", "straightforward", "--device", "cpu", "-w", "smoke_tall_1x64x48",
                            "--store", str(store), "--json", str(js), "--markdown", str(md)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "geomean speedup" in r.output
    data = json.loads(js.read_text())
    assert data[0]["candidate"]["results"][0]["status"] == "ok"
    assert data[0]["baseline"]["solution"] == "reference"
    assert "| smoke_tall_1x64x48 | ok |" in md.read_text()
    r = runner.invoke(app, ["results", "--store", str(store)], env={"COLUMNS": "250"})
    assert r.exit_code == 0 and "straightforward" in r.output and "smoke_tall_1x64x48" in r.output


def test_eval_failing_solution_exits_nonzero_with_cause(tmp_path):
    from conftest import SOLUTIONS

    r = runner.invoke(app, ["eval", "muon_newton_schulz", str(SOLUTIONS / "muon" / "alias_input.py"), "--device", "cpu",
                            "-w", "smoke_wide_2x32x96", "--baseline", "none", "--store", str(tmp_path / "s.sqlite")],
                      env={"COLUMNS": "250"})
    assert r.exit_code == 1
    assert "integrity_violation" in r.output and "rule no_aliasing" in r.output


def test_eval_unknown_workload():
    r = runner.invoke(app, ["eval", "muon_newton_schulz", "reference", "--device", "cpu", "-w", "nope"])
    assert r.exit_code == 2 and "has no workload 'nope'" in r.output
    assert not r.output.lstrip().startswith('"')  # the message itself, not a KeyError's repr


def test_gpu_sized_workloads_on_the_cpu_get_a_note(capsys):
    from d2kbench.cli import _warn_slow_on_cpu
    from d2kbench.tasks import load_task

    t = load_task("muon_newton_schulz")
    paper, smoke = t.spec.workload("paper_32x2048x5464"), t.spec.smoke_workloads[0]
    _warn_slow_on_cpu(t, "cpu", [smoke])
    _warn_slow_on_cpu(t, "cuda", [paper])
    assert capsys.readouterr().out == ""
    _warn_slow_on_cpu(t, "cpu", [smoke, paper])
    out = capsys.readouterr().out
    assert "paper_32x2048x5464 is GPU-sized" in out and smoke.id not in out


def test_errors_print_brackets_as_written():
    """Every command group prints errors through ``terminal.print_error``: text with brackets
    (an index, a TOML table, a closing tag) comes out as written; read as rich markup, the
    closing tag raises and the index could vanish as a style."""
    message = "input w13[0, 130, 98] changed; see [tool.ruff] in pyproject.toml [/x]"
    out = io.StringIO()
    print_error(Console(file=out, width=40, color_system=None), message)
    assert out.getvalue() == message + "\n"  # one line although wider than the console
    with pytest.raises(rich.errors.MarkupError):
        Console(file=io.StringIO()).print(f"[red]{message}[/red]")
    src = Path(__file__).resolve().parents[1] / "src" / "d2kbench"
    leftover = [f"{p.relative_to(src)}:{i + 1}" for p in src.rglob("*.py")
                for i, line in enumerate(p.read_text().splitlines()) if 'print(f"[red]{' in line]
    assert leftover == []


def test_sigterm_records_the_evaluation_interrupted_and_ends_by_sigterm(tmp_path):
    # a timeout wrapper sends SIGTERM: the store must not keep the evaluation "running" forever,
    # no worker may outlive d2k, and the exit status still says SIGTERM (campaign executors read it)
    store = tmp_path / "d2k.sqlite"
    proc = subprocess.Popen([sys.executable, "-m", "d2kbench.cli", "eval", "muon_newton_schulz",
                             str(SOLUTIONS / "muon" / "hang.py"), "--device", "cpu", "--baseline", "none",
                             "--store", str(store)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "TRITON_INTERPRET": "1"})
    deadline = time.monotonic() + 120
    workers: list[int] = []
    while time.monotonic() < deadline and not workers:  # the worker is in the hanging call
        time.sleep(0.5)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        workers = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                                  text=True).stdout.split()]
        if workers and store.exists():
            with Store(store) as s:
                if not s.evaluation_states():
                    workers = []
        else:
            workers = []
    assert workers, "the evaluation never reached its worker"
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM
    with Store(store) as s:  # the status written by d2k itself (evaluation_states() would infer it from the dead pid)
        assert [r[0] for r in s.conn.execute("SELECT status FROM evaluations")] == ["interrupted"]
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
