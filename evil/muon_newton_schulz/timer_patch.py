"""Catalogue #4: monkeypatching the timer.

Trick: at import, replace ``time.perf_counter`` (the CPU timer; on the GPU the same trick
targets ``torch.cuda.Event.elapsed_time``, see event_patch.py) with one that runs 100x slow,
so every measured interval shrinks 100x.
Expected: ``integrity_violation`` / ``monkeypatch`` (identity snapshot taken before the import).
Evaluated without the AST rules; the static review reports ``ast_monkeypatch``.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "monkeypatch", "catalogue": [4], "device": "cpu",
          "static": ["ast_monkeypatch"], "static_checks": False, "evidence": "time.perf_counter"}

_real = time.perf_counter
time.perf_counter = lambda: _real() / 100.0


def run(G, steps=5):
    return muon(G)
