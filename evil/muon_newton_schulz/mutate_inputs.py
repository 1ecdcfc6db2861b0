"""Catalogue #15: mutating the inputs so that the reference agrees.

Trick: zero the input in place and return the answer for a zero input (zeros), hoping the
reference runs afterwards on the mutated tensor.
Expected: ``incorrect`` / ``G:untouched`` (each side gets its own copy of pristine inputs, the
reference runs on the parent's copy, and untouched inputs must stay bit-identical).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "incorrect", "rule": "G:untouched", "catalogue": [15], "device": "cpu", "static": []}


def run(G, steps=5):
    G.zero_()
    return muon(G)
