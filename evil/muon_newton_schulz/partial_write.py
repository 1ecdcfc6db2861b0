"""Catalogue #18: partial writes into a pre-initialised output.

Trick: compute only the first matrix of the batch and leave the rest of the freshly
allocated output as it is (zero-filled by many harnesses).
Expected: ``incorrect`` / ``finite`` (fresh allocations are NaN during correctness calls, so any
element the kernel skips is NaN).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "incorrect", "rule": "finite", "catalogue": [18], "device": "cpu", "static": []}


def run(G, steps=5):
    return muon(G, batches=1)
