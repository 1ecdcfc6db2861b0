"""Catalogue #35 and #12: a process that outlives the worker.

Trick: start a detached process (its own session) through ``_posixsubprocess.fork_exec``, the
primitive under ``subprocess`` that raises no audit event. Such a process could wait until the
evaluator has exited and then rewrite its results file, or stop the baseline's worker while it
is timed. The result itself is honest.
Before the OS sandbox it survived the worker (and ``d2k``) and rewrote the ``--json`` results.
Expected now: ``integrity_violation`` / ``process_control`` on the CPU (the worker's seccomp
filter kills it at the fork) and ``child_process`` on the GPU, where workers may start
processes (the parent sees the process in the worker's sandbox after ``run`` returned and kills
it; the sandbox's PID namespace ends with the worker in any case).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "child_process|process_control", "catalogue": [35, 12], "device": "cpu",
          "static": ["ast_forbidden_import"], "static_checks": False}

_started = []


def _detach(argv: list[str]) -> int:
    import _posixsubprocess

    exe = [os.fsencode(argv[0])]
    null = os.open(os.devnull, os.O_RDWR)
    r, w = os.pipe()
    pid = _posixsubprocess.fork_exec(argv, exe, True, (), None, None, null, -1, -1, null, -1, null, r, w,
                                     True, True, -1, None, None, None, -1, None, False)
    os.close(r)
    os.close(w)
    return pid


def run(G, steps=5):
    if not _started:
        _started.append(_detach(["/bin/sh", "-c", "sleep 120"]))
    return muon(G)
