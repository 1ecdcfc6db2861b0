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
