"""Catalogue #5: patching the harness's statistics.

Trick: import the harness's timing module and replace ``summarize`` with one that divides every
sample by 1000 before computing the statistics.
Expected: ``integrity_violation`` / ``monkeypatch`` (every function of the harness modules is in
the identity snapshot). Static review: ``ast_forbidden_import`` (d2kbench), ``ast_monkeypatch``.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

import d2kbench.harness.timing as T  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "monkeypatch", "catalogue": [5], "device": "cpu",
          "static": ["ast_forbidden_import", "ast_monkeypatch"], "static_checks": False,
          "evidence": "d2kbench.harness.timing.summarize"}

_summarize = T.summarize
T.summarize = lambda samples, mode, **kw: _summarize([s / 1000 for s in samples], mode, **kw)


def run(G, steps=5):
    return muon(G)
