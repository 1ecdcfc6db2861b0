"""The worker fork server: a CPU worker forked into its bubblewrap sandbox is as confined as one
started there by ``exec`` (no capability, no_new_privs, the seccomp filter, the sandbox's PID
namespace and root, no descriptor of the server or the host), ends as before, and starts in a
fraction of the time. The escape tests of ``test_sandbox.py`` and the evil suite run through it
too (it is the default on the CPU).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from d2kbench.checking.verdict import WorkerFailure
from d2kbench.harness import forkserver
from d2kbench.harness.process import WorkerHandle
from d2kbench.sandbox import bwrap
from d2kbench.sandbox.nsenter import confinement_problems

pytestmark = pytest.mark.skipif(not bwrap.status().active, reason=f"no OS sandbox: {bwrap.status().reason}")

#: A solution that, when imported, writes what its process sees of itself into its HOME.
PROBE = textwrap.dedent("""
    import json, os, sys

    def _fds():
        out = {}
        for fd in os.listdir("/proc/self/fd"):
            try:
                out[fd] = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                pass
        return out

    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    report = {"status": {k: v.strip() for k, v in status.items()}, "pid": os.getpid(), "ppid": os.getppid(),
              "fds": _fds(), "root": sorted(os.listdir("/")), "argv": sys.argv, "cwd": os.getcwd(),
              "home": os.environ.get("HOME"), "env": sorted(os.environ), "tests_visible": os.path.exists(TESTS),
              "pids": sorted(
                  int(p) for p in os.listdir("/proc") if p.isdigit())}
    try:
        open("/proc/2/mem", "rb").close()  # the placeholder (bubblewrap's init is 1)
        report["placeholder_mem"] = "opened"
    except OSError as e:
        report["placeholder_mem"] = type(e).__name__
    report["session"] = [os.getsid(0), os.getpgid(0)]
    with open(os.path.join(os.environ["HOME"], "probe.json"), "w") as f:
        json.dump(report, f)

    def run(G, steps=5):
        return G
""")


def _probe(muon, tmp_path: Path, options: dict | None = None) -> tuple[dict, WorkerHandle]:
    sol = tmp_path / "probe.py"
    sol.write_text(PROBE.replace("TESTS", repr(str(Path(__file__).parent))))
    h = WorkerHandle(muon.root, sol, "cpu", 120, {"integrity": True, **(options or {})})
    h.start()
    return json.loads((h.workdir / "probe.json").read_text()), h


def test_a_forked_worker_is_confined_like_an_exec_started_one(muon, tmp_path):
    report, h = _probe(muon, tmp_path)
    try:
        assert h.worker_pid is not None, "the worker was not forked"
        st = report["status"]
        for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert int(st[cap], 16) == 0, f"{cap} = {st[cap]}"
        assert st["NoNewPrivs"] == "1"
        assert st["Seccomp"] == "2"  # the process filter of an untrusted CPU worker
        # the sandbox's PID namespace: its parent (the server's child) is outside, so not visible
        assert report["ppid"] == 0 and report["pid"] < 10
        assert report["session"] == [report["pid"]] * 2  # its own session and group, not the server's
        assert report["pids"] == sorted(report["pids"]) and len(report["pids"]) <= 4  # init, placeholder, worker
        # the sandbox's root: the project checkout and the host's home are not there
        assert not report["tests_visible"]
        assert report["cwd"] == str(h.workdir) == report["home"]
        assert report["argv"][1:] == [report["argv"][1]] and report["argv"][1].isdigit()
        # descriptors: the standard three, the pipe to the parent; nothing of the server or the host
        targets = sorted(report["fds"].values())
        sockets = [t for t in targets if t.startswith("socket:")]
        assert len(sockets) == 1, targets
        assert not [t for t in targets if t.startswith("pipe:")], targets
        assert report["fds"]["0"] == "/dev/null" and report["fds"]["1"].endswith("worker.log")
        assert "d2k-forkserver" not in " ".join(targets)
        assert not {"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "D2K_STORE"} & set(report["env"])
        # the sandbox is the worker's: the parent sees it among the sandbox's processes
        assert h.worker_pid in h.sandbox_pids() and h.stray_processes() == []
    finally:
        h.close()


def test_the_placeholder_is_out_of_a_workers_reach(muon, tmp_path):
    """The sandbox's placeholder (a process without the seccomp filter) is not dumpable: the
    kernel itself refuses the worker its memory, also with the in-worker monitors off (with them
    on, the audit hook refuses first)."""
    report, h = _probe(muon, tmp_path, {"integrity": False})
    try:
        assert h.worker_pid is not None
        assert report["placeholder_mem"] == "PermissionError"
    finally:
        h.close()


def test_exec_start_is_still_available(muon, tmp_path, monkeypatch):
    monkeypatch.setenv("D2K_WORKER_START", "exec")
    report, h = _probe(muon, tmp_path)
    try:
        assert h.worker_pid is None
        assert int(report["status"]["CapEff"], 16) == 0 and report["status"]["Seccomp"] == "2"
    finally:
        h.close()
    monkeypatch.setenv("D2K_WORKER_START", "sometimes")
    with pytest.raises(ValueError, match="D2K_WORKER_START"):
        forkserver.wanted("cpu", True)


def test_forked_workers_start_faster_and_report_how_they_ended(muon, tmp_path):
    sol = tmp_path / "dies.py"
    sol.write_text("import os\n\ndef run(G, steps=5):\n    os._exit(7)\n")
    import torch

    first = WorkerHandle(muon.root, sol, "cpu", 120, {"integrity": True})
    first.start()  # the server is up now
    first.close()
    h = WorkerHandle(muon.root, sol, "cpu", 120, {"integrity": True})
    h.start()
    assert h.worker_pid is not None
    assert h.startup_s["process_start"] < 0.5, h.startup_s  # an exec-started worker imports torch: seconds
    with pytest.raises(WorkerFailure, match="exit code 7"):
        h.request({"op": "call", "args": [torch.zeros(2, 2)]})
    assert not h.alive()
    h.close()


def test_a_process_that_is_not_sandboxed_cannot_be_entered():
    code = ("import os, sys\nfrom d2kbench.sandbox.nsenter import EnterFailed, enter\n"
            "try:\n    enter(os.getppid())\nexcept EnterFailed as e:\n    print('refused:', e)\n    sys.exit(3)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 3 and "is not in a sandbox" in p.stdout, p.stdout + p.stderr


def test_confinement_problems_name_what_is_left():
    # this test process: not confined (capabilities as root, or no_new_privs off as a user)
    assert confinement_problems()
    code = ("from d2kbench.sandbox.nsenter import confinement_problems, drop_capabilities\n"
            "drop_capabilities()\nprint(confinement_problems())\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr


def test_a_failing_fork_server_falls_back_to_the_plain_start_loudly(muon, tmp_path, monkeypatch, capsys):
    from d2kbench.harness import process

    def refuse(*_a, **_k):
        raise forkserver.ForkServerUnavailable("cannot enter the sandbox: refused on purpose")

    monkeypatch.setattr(process, "_fork_failed", [])
    monkeypatch.setattr(process, "_warned", set())
    monkeypatch.setattr(forkserver.ForkServer, "spawn", refuse)
    report, h = _probe(muon, tmp_path)
    try:
        assert h.worker_pid is None and int(report["status"]["CapEff"], 16) == 0
        assert report["status"]["Seccomp"] == "2" and report["ppid"] != 0  # bubblewrap's init started it
    finally:
        h.close()
    assert "fork server is unavailable (cannot enter the sandbox: refused on purpose)" in capsys.readouterr().err
    assert process._fork_failed  # the next worker does not try again


def _worker_handle(muon, folder: Path, name: str, source: str, integrity: bool) -> WorkerHandle:
    folder.mkdir(parents=True, exist_ok=True)
    sol = folder / name
    sol.write_text(textwrap.dedent(source))
    return WorkerHandle(muon.root, sol, "cpu", 120, {"integrity": integrity})


def _victim_and_attacker(muon, tmp_path: Path, attacker_source: str, integrity: bool):
    """An honest worker, then an attacker's, both forked from this process's fork server (started);
    returns ``(victim, attacker, the server's process)``. The caller closes both."""
    victim = _worker_handle(muon, tmp_path / "victim", "victim.py", "def run(G, steps=5):\n    return G\n", integrity)
    attacker = _worker_handle(muon, tmp_path / "attacker", "attacker.py", attacker_source, integrity)
    try:
        victim.start()
        attacker.start()
        assert victim.worker_pid is not None and attacker.worker_pid is not None, "the workers were not forked"
        server = forkserver.server().proc
        assert server is not None
    except BaseException:
        attacker.close()
        victim.close()
        forkserver.shutdown()
        raise
    return victim, attacker, server


def test_a_forked_worker_cannot_signal_the_fork_servers_process_group(muon, tmp_path):
    """kill(0, sig) reaches the caller's process group, whatever PID namespace its members are in
    (kill(2), signal.c ``__kill_pgrp_info``). A worker started by exec is in a session of its
    own inside the sandbox (bubblewrap's ``--new-session``); a forked worker must be too, not
    in the fork server's, which holds the server, its children outside every sandbox and every
    other forked worker (another solution's, the reference's): the OS sandbox alone (integrity
    off) must keep them out of reach."""
    import torch

    victim, attacker, server = _victim_and_attacker(muon, tmp_path, """
        import os, signal

        def run(G, steps=5):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the attacker survives its own signal
            os.kill(0, signal.SIGTERM)  # pid 0: every process of this process's group
            return G
        """, False)
    try:
        attacker.request({"op": "call", "args": [torch.zeros(2, 2)]})
        time.sleep(0.5)
        assert server.poll() is None, "a solution's worker killed the fork server"
        assert attacker.alive(), "the worker's outside child (its exit-status reporter) was killed: the parent " \
                                 "now believes a live worker dead and skips its after-call checks"
        assert victim.alive(), "a solution's worker killed another solution's worker"
        victim.request({"op": "call", "args": [torch.zeros(2, 2)]})
    finally:
        attacker.close()
        victim.close()
        forkserver.shutdown()  # a fresh server for the tests that follow, whatever happened to this one


def test_a_forked_worker_cannot_renice_the_fork_server_or_other_workers(muon, tmp_path):
    """setpriority(PRIO_PGRP, 0, ...) (no audit event, no capability needed to lower a priority)
    renices every process of the caller's process group across PID namespaces: a forked worker in
    the fork server's group would slow down the server (and so every worker it forks later) and
    every concurrent forked worker, e.g. the baseline it is timed against. With integrity on."""
    import os

    victim, attacker, server = _victim_and_attacker(muon, tmp_path, """
        import os

        os.setpriority(os.PRIO_PGRP, 0, 19)

        def run(G, steps=5):
            return G
        """, True)
    try:
        before = os.getpriority(os.PRIO_PROCESS, os.getpid())
        assert os.getpriority(os.PRIO_PROCESS, server.pid) == before, "a solution's worker reniced the fork server"
        assert os.getpriority(os.PRIO_PROCESS, victim.worker_pid) == before, \
            "a solution's worker reniced another solution's worker"
    finally:
        attacker.close()
        victim.close()
        forkserver.shutdown()  # do not leave a reniced server to the tests that follow
