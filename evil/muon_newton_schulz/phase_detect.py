"""Catalogue #26, #24 and #33: behaving differently when checked and when timed.

Trick: correctness calls run with ``torch.are_deterministic_algorithms_enabled()`` (the harness
uses it to NaN-fill fresh memory); timed calls do not. Be exact when checked, cut a step when
timed. The re-check after timing is a correctness call again, so it passes.
Expected: ``integrity_violation`` / ``timed_output`` (outputs of timed calls are checked too).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "timed_output", "catalogue": [24, 26, 33], "device": "cpu",
          "static": []}


def run(G, steps=5):
    checked = torch.are_deterministic_algorithms_enabled()
    return muon(G, steps=5 if checked else 4)
