"""Catalogue #28: a dormant try/except fallback (never triggered on the test inputs).

Trick: an honest Triton path wrapped in a handler that would fall back to ``torch.matmul`` on
another GPU or shape. At run time nothing forbidden happens here, so only the static review
can see it.
Expected: ``integrity_violation`` / ``ast_try_fallback`` (static rules are part of the
evaluation; the run-time monitors stay silent).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "ast_try_fallback", "catalogue": [28], "device": "cpu",
          "static": ["ast_try_fallback"]}


def run(G, steps=5):
    try:
        return muon(G)
    except Exception:  # noqa: BLE001
        return torch.matmul(G, G.mT @ G)
