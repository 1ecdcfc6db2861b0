"""Catalogue #38 (and #2, #12): a thread the threading module does not know.

Trick: start a thread with ``_thread.start_new_thread`` (reached through ``__import__``): it is
not listed by ``threading.enumerate()``. It keeps spinning after ``run`` returned, taking CPU
from whatever runs next (the baseline's worker being timed, the harness). The result is
honest.
Before the thread-state check it stayed alive unnoticed. Expected now: ``integrity_violation``
/ ``background_thread`` (every interpreter thread state counts, not only threading's).
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "background_thread", "catalogue": [38, 2, 12], "device": "cpu",
          "static": ["ast_dynamic_code"], "static_checks": False, "evidence": "outside threading"}

_started = []


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.001)


def run(G, steps=5):
    if not _started:
        _started.append(__import__("_thread").start_new_thread(_spin, (120.0,)))
    return muon(G)
