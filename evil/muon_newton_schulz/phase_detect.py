"""Catalogue #26, #24 and #33: behaving differently when checked and when timed.

Trick: correctness calls fill fresh memory with NaN (PyTorch's deterministic mode with
``fill_uninitialized_memory``); timed calls run in the same deterministic mode but without the
fill (a fill kernel per allocation would be timed), and that flag can be read. Be exact when
checked, cut a step when timed. The re-check after timing is a correctness call again, so it
passes.
Expected: ``integrity_violation`` / ``timed_output`` (outputs of timed calls are checked too:
checked calls are drawn from inside the timed sequence).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "timed_output", "catalogue": [24, 26, 33], "device": "cpu",
          "static": []}


def run(G, steps=5):
    checked = torch.utils.deterministic.fill_uninitialized_memory
    return muon(G, steps=5 if checked else 4)
