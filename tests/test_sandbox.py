"""The OS sandbox of solution workers (bubblewrap): what a solution can no longer reach.

Each test runs a real evaluation whose solution is honest in its result and tries one escape on
the side; the assertions look at the host from outside the sandbox: the store, the results
file, the virtual environment, the project and ``/tmp`` are unchanged, no connection reached a
listening socket, credentials in the evaluator's environment were not visible, and no process
of the solution survives the evaluation, also when the evaluator itself is killed.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import stage_with_muon_sf

from d2kbench.harness.evaluate import Options, evaluate
from d2kbench.sandbox import bwrap
from d2kbench.sandbox.process import descendants
from d2kbench.store import Store

pytestmark = pytest.mark.skipif(not bwrap.status().active, reason=f"no OS sandbox: {bwrap.status().reason}")
WL = "smoke_wide_2x32x96"


def _solution(folder: Path, body: str) -> Path:
    """A correct Muon solution (the straightforward kernels) that first runs ``body`` in run()."""
    stage_with_muon_sf(folder)
    sol = folder / "escape.py"
    sol.write_text("import os, sys\nimport _muon_sf as sf\n\n\ndef run(G, steps=5):\n"
                   + textwrap.indent(textwrap.dedent(body), "    ") + "\n    return sf.run(G, steps)\n")
    return sol


def _eval(muon, sol: Path, store=None):
    return evaluate(muon, sol, [muon.spec.workload(WL)], "cpu", None, store=store,
                    options=Options(timeout_s=120, time_solutions=False, integrity=False))


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_a_solution_cannot_write_the_store_the_venv_the_project_or_host_tmp(muon, tmp_path):
    store_path = tmp_path / "store.sqlite"
    Store(store_path).close()
    before = _digest(store_path)
    marker = f"d2k-escape-{os.getpid()}-{time.time_ns()}"
    venv_bin = Path(sys.executable).parent
    body = f"""
    import sqlite3
    attempts = {{}}
    for path in [{str(store_path)!r}, {str(venv_bin / marker)!r}, {str(Path.cwd() / marker)!r},
                 {str(muon.root / marker)!r}, "/tmp/{marker}"]:
        try:
            with open(path, "a") as f:
                f.write("tampered")
            attempts[path] = "written"
        except OSError as e:
            attempts[path] = type(e).__name__
    try:
        con = sqlite3.connect({str(store_path)!r})
        con.execute("CREATE TABLE tampered (x)")
        con.commit()
    except sqlite3.Error:
        pass
    """
    ev = _eval(muon, _solution(tmp_path / "sol", body))
    assert ev.candidate.results[0].status.value == "ok", ev.candidate.results[0].cause
    assert ev.env["sandbox"].startswith("bwrap")
    assert _digest(store_path) == before
    for p in (venv_bin / marker, Path.cwd() / marker, muon.root / marker, Path("/tmp") / marker):
        assert not p.exists(), p


def test_no_network_and_no_credentials_inside(muon, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-of-the-evaluator")
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    hits = []

    def accept() -> None:
        srv.settimeout(20)
        try:
            hits.append(srv.accept())
        except OSError:
            pass

    th = threading.Thread(target=accept, daemon=True)
    th.start()
    body = f"""
    import socket
    if "OPENAI_API_KEY" in os.environ or any("sk-secret" in v for v in os.environ.values()):
        raise RuntimeError("the evaluator's credentials are visible")
    try:
        socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
    except OSError:
        pass
    """
    ev = _eval(muon, _solution(tmp_path / "sol", body))
    srv.close()
    th.join(5)
    assert ev.candidate.results[0].status.value == "ok", ev.candidate.results[0].cause
    assert hits == []


@pytest.mark.parametrize("sandbox", ["auto", "off"])
def test_a_solution_cannot_read_the_evaluators_memory(muon, tmp_path, monkeypatch, sandbox):
    """Without the worker's monitors (no audit hook), the evaluator's memory stays out of reach:
    under bubblewrap its process is not even visible (another PID namespace); without a sandbox
    (same user, same namespaces) the evaluator is non-dumpable, so ``/proc/<pid>/mem`` cannot be
    opened. A solution that reads it anyway returns a wrong result."""
    monkeypatch.setenv("D2K_SANDBOX", sandbox)
    sol = _solution(tmp_path / "sol", f"""
    read = b""
    try:
        with open("/proc/{os.getpid()}/mem", "rb", buffering=0) as mem:
            for line in open("/proc/{os.getpid()}/maps"):
                lo = int(line.split("-")[0], 16)
                try:
                    mem.seek(lo)
                    read = mem.read(16)
                    break
                except OSError:
                    continue
    except OSError:
        pass
    if read:
        return sf.run(G, 4)  # the evaluator's memory was readable: a wrong result
    """)
    ev = _eval(muon, sol)
    assert ev.env["sandbox"].startswith("bwrap" if sandbox == "auto" else "none")
    r = ev.candidate.results[0]
    assert r.status.value == "ok", f"the evaluator's memory was readable: {r.status.value} {r.cause[:200]}"


def _solution_processes(tag: str) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if tag.encode() in Path(f"/proc/{name}/cmdline").read_bytes():
                    out.append(int(name))
            except OSError:
                continue
    return out


def test_nothing_survives_when_the_evaluator_is_killed(tmp_path):
    """SIGKILL the evaluating process while its solution spins and has started a detached
    grandchild: the kernel ends the whole sandbox (bubblewrap's --die-with-parent and the
    sandbox's PID namespace), so no process is left behind."""
    tag = f"d2k-orphan-{os.getpid()}-{time.time_ns()}"
    sol = _solution(tmp_path / "sol", f"""
    import _posixsubprocess
    null = os.open(os.devnull, os.O_RDWR)
    r, w = os.pipe()
    _posixsubprocess.fork_exec(["/bin/sh", "-c", "sleep 300; :", "{tag}"], [b"/bin/sh"], True, (), None, None,
                               null, -1, -1, null, -1, null, r, w, True, True, -1, None, None, None, -1, None, False)
    while True:
        pass
    """)
    script = (f"from d2kbench.harness.evaluate import Options, evaluate\n"
              f"from d2kbench.tasks import load_task\n"
              f"t = load_task('muon_newton_schulz')\n"
              f"evaluate(t, {str(sol)!r}, [t.spec.workload({WL!r})], 'cpu', None,\n"
              f"         options=Options(timeout_s=300, time_solutions=False, integrity=False))\n")
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not _solution_processes(tag):
        time.sleep(0.5)
    assert _solution_processes(tag), "the solution never started its grandchild"
    tree = [pid for pid, _ppid, _start in descendants(proc.pid)]
    assert len(tree) >= 3, "the evaluator has no sandboxed worker"  # bwrap, its init, the worker, ...
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (_solution_processes(tag) or _alive(tree)):
        time.sleep(0.2)
    assert _solution_processes(tag) == [] and _alive(tree) == []


def _alive(pids: list[int]) -> list[int]:
    out = []
    for p in pids:
        try:
            state = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        if state[state.rfind(")") + 2] != "Z":
            out.append(p)
    return out


def test_the_evaluator_is_not_dumpable():
    """Evaluating makes the parent non-dumpable: a process without CAP_SYS_PTRACE over it (every
    worker: a sandboxed one has no capabilities, an unsandboxed one drops them) cannot read its
    ``/proc/<pid>/mem`` even under the same user."""
    from d2kbench.sandbox.process import _PR_GET_DUMPABLE, _prctl, protect_parent

    assert protect_parent()
    assert _prctl(_PR_GET_DUMPABLE) == 0


def test_sandbox_modes_are_recorded_and_require_fails_loudly(monkeypatch, capsys):
    from d2kbench.harness.env import fingerprint

    monkeypatch.setattr(bwrap, "_warned", set())  # once per process: an earlier test may have been warned
    monkeypatch.setenv("D2K_SANDBOX", "off")
    env = fingerprint("cpu")
    assert env["sandbox"] == "none (turned off by D2K_SANDBOX=off)"
    assert env["process_filter"].startswith("seccomp") and fingerprint("cuda")["process_filter"].startswith("none")
    assert "WITHOUT an OS sandbox" in capsys.readouterr().err
    monkeypatch.setenv("D2K_SANDBOX", "require")
    monkeypatch.setenv("D2K_BWRAP", "/nonexistent/bwrap")
    with pytest.raises(bwrap.SandboxUnavailable, match="is not an executable file"):
        bwrap.status()
    monkeypatch.setenv("D2K_SANDBOX", "sometimes")
    with pytest.raises(ValueError, match="D2K_SANDBOX"):
        bwrap.status()


def test_an_agent_cli_session_sees_its_workspace_only(tmp_path):
    """The sandbox every CLI backend (Claude Code, Codex) runs in, with bash as the CLI: the
    workspace, the configuration folder and the request folder are writable; the suite's
    held-back files, the store and the project are not there; the host's /tmp is private."""
    from d2kbench.agents.backends.cli import agent_sandbox
    from d2kbench.agents.workspace import load_config, stage_workspace
    from d2kbench.tasks import load_task
    from d2kbench.tasks.loader import SUITE_DIR

    task = load_task("muon_newton_schulz")
    ws = stage_workspace(task, tmp_path / "run" / "workspace", "none", device="cpu",
                         run_dir=tmp_path / "run" / "control", runner=True)
    home = tmp_path / "run" / "cli-home"
    home.mkdir()
    store = tmp_path / "store.sqlite"
    store.write_text("results")
    host_tmp = Path("/tmp") / f"d2k-agent-probe-{os.getpid()}"
    host_tmp.write_text("host")
    expert = SUITE_DIR / task.id / "solutions" / "expert.py"
    probe = "; ".join([
        f"test -e {expert} && echo SEES_EXPERT", f"ls {SUITE_DIR} | grep -q . && echo SEES_SUITE",
        f"test -e {store} && echo SEES_STORE", f"test -e {host_tmp} && echo SEES_HOST_TMP",
        f"test -e {Path.cwd() / 'tests'} && echo SEES_PROJECT",
        "touch solution.py && echo WS_WRITABLE", f"touch {home}/x && echo HOME_WRITABLE",
        f"touch {load_config(ws).run_dir}/x && echo RUN_DIR_WRITABLE",
        f"touch {tmp_path / 'run'}/x 2>/dev/null; touch {tmp_path / 'run' / 'candidates-evaluated'} 2>/dev/null",
        "true"])
    cmd, env = agent_sandbox(["bash", "-c", probe], cwd=ws, env={"PATH": os.environ["PATH"]}, config_dir=home)
    out = subprocess.run(cmd, cwd=ws, env=env, capture_output=True, text=True, timeout=60)
    host_tmp.unlink()
    assert out.returncode == 0, out.stderr
    seen = set(out.stdout.split())
    assert {"WS_WRITABLE", "HOME_WRITABLE", "RUN_DIR_WRITABLE"} <= seen, out.stdout + out.stderr
    assert not seen & {"SEES_EXPERT", "SEES_SUITE", "SEES_STORE", "SEES_HOST_TMP", "SEES_PROJECT"}, seen
    # the run directory around the bound folders (where the runner keeps its own copies of
    # candidates) is not the host's: what the agent writes there is gone with the sandbox
    assert not (tmp_path / "run" / "x").exists() and not (tmp_path / "run" / "candidates-evaluated").exists()
    assert (home / "x").exists() and (Path(load_config(ws).run_dir) / "x").exists()
