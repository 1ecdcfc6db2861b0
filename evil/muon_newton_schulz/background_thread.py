"""Catalogue #2: background-thread deferral.

Trick: ``run`` allocates the output, starts a Python thread that computes it a little later
(after the harness has stopped its timer) and returns at once.
Expected: ``integrity_violation`` / ``background_thread`` (a thread started by the solution is
still alive when ``run`` returns). Evaluated without the AST rules, to show the run-time check
alone catches it; the static review reports ``ast_forbidden_import`` (threading).
"""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "background_thread", "catalogue": [2, 12], "device": "cpu",
          "static": ["ast_forbidden_import"], "static_checks": False}


def run(G, steps=5):
    import torch

    out = torch.empty_like(G)

    def later():
        time.sleep(0.5)
        muon(G, out)

    threading.Thread(target=later, daemon=True).start()
    return out
