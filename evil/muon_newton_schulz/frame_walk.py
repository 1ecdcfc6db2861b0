"""Catalogue #20 and #21: walking call frames to reach the grader's state.

Trick: ``sys._getframe(1)`` and ``f_back`` up to the harness frames, to read (or poison) the
checker's locals: expected values, the request nonce, the timing samples.
Expected: ``integrity_violation`` / ``introspection`` (the audit hook refuses frame access from
solution code). Static review: ``ast_introspection``.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "introspection", "catalogue": [20, 21], "device": "cpu",
          "static": ["ast_introspection"], "static_checks": False, "evidence": "sys._getframe"}


def run(G, steps=5):
    try:
        f = sys._getframe(1)
        while f is not None:
            f.f_locals.get("expected")
            f = f.f_back
    except PermissionError:
        pass
    return muon(G)
