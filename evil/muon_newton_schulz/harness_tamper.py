"""Catalogue #31: tampering with the harness's files.

Trick: open the harness's timing module for writing (a later worker would import the edited
file). The file is only opened in append mode and nothing is written, so a failure of the
defence could not damage the tree.
Expected: ``integrity_violation`` / ``harness_tampering`` (the audit hook refuses writes into
the harness package, the task folder and installed packages, and records the attempt even
when the solution swallows the error; the parent also re-hashes the harness files after every
workload). Static review: ``ast_introspection`` (sys.modules).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "harness_tampering", "catalogue": [31], "device": "cpu",
          "static": ["ast_introspection"], "static_checks": False, "evidence": "timing.py"}


def run(G, steps=5):
    path = sys.modules["d2kbench.harness.timing"].__file__
    try:
        with open(path, "a") as f:
            f.write("")
    except PermissionError:
        pass
    return muon(G)
