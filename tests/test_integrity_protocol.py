"""The trust boundary itself: what crosses the pipe, and the CLI.

* the parent never sends expected values (or correctness seeds) to the worker: every ``call``
  request carries only the arguments and a nonce, and no other request carries a tensor;
* ``d2k eval`` prints the violated rule and its evidence; ``d2k evil`` runs cases and writes
  JSON/markdown; ``d2k lint`` applies the static rules.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from typer.testing import CliRunner

from d2kbench.cli import app
from d2kbench.harness import process
from d2kbench.harness.evaluate import Options, evaluate
from d2kbench.harness.evil import EVIL_DIR
from d2kbench.integrity.parent import external_edit_only
from d2kbench.tasks import load_task

PROBE = EVIL_DIR / "_tasks" / "graph_probe"


def _tensors(obj) -> list:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return []


def test_worker_never_receives_expected_values(monkeypatch):
    sent = []
    original = process.WorkerHandle.request

    def spy(self, msg, timeout_s=None):
        sent.append(msg)
        return original(self, msg, timeout_s)

    monkeypatch.setattr(process.WorkerHandle, "request", spy)
    task = load_task(PROBE)
    for _ in range(2):  # once more if someone edited the working tree during the run
        sent.clear()
        ev = evaluate(task, EVIL_DIR / "graph_probe" / "honest_control.py", list(task.spec.smoke_workloads), "cpu",
                      None, options=Options(timeout_s=120, cpu_samples=1))
        if not external_edit_only(ev):
            break
    assert ev.candidate.results[0].status.value == "ok", ev.candidate.results[0].cause
    calls = [m for m in sent if m["op"] == "call"]
    assert len(calls) == 3 + 1 + 1  # correctness calls, the sensitivity call, the re-check after timing
    for m in calls:
        assert set(m) == {"op", "args"}
        assert [tuple(t.shape) for t in _tensors(m)] == [(4096,), (4096,)]  # x and y: inputs only
    for m in sent:
        if m["op"] != "call":
            assert not _tensors(m), m["op"]  # timing gets seeds of its own input sets, never values
    (time_msg,) = [m for m in sent if m["op"] == "time"]
    assert set(time_msg["integrity"]) == {"stash_seed", "profile_seeds", "verify_seed"}


def test_eval_cli_prints_the_violated_rule(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["eval", "muon_newton_schulz", str(EVIL_DIR / "muon_newton_schulz" / "alias_input.py"),
                              "--device", "cpu", "--baseline", "none", "-w", "smoke_wide_2x32x96",
                              "--store", str(tmp_path / "s.sqlite")], env={"COLUMNS": "250"})
    assert res.exit_code == 1
    out = " ".join(res.output.split())
    assert "integrity_violation" in out
    assert "rule no_aliasing: output 0 shares storage with argument 0" in out


def test_evil_cli_writes_tables(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["evil", "--device", "cpu", "-k", "muon_newton_schulz/alias_input", "-k", "graph_probe/honest",
                              "--json", str(tmp_path / "e.json"), "--markdown", str(tmp_path / "e.md")])
    assert res.exit_code == 0, res.output
    rows = json.loads((tmp_path / "e.json").read_text())
    assert {r["name"] for r in rows} == {"alias_input", "honest_control"} and all(r["passed"] for r in rows)
    assert "2/2 rejected as expected" in Path(tmp_path / "e.md").read_text()


def test_lint_cli(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\ndef run(a):\n    return a @ a\n")
    res = CliRunner().invoke(app, ["lint", str(bad)])
    assert res.exit_code == 1 and "ast_forbidden_call" in res.output
