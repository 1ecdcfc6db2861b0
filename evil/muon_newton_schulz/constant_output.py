"""Catalogue #16: a constant output that might slip under a loose tolerance.

Trick: return zeros (written by a Triton kernel launch-alike: zeros plus a do-nothing kernel).
Expected: ``incorrect`` / ``rel_fro`` (relative Frobenius tolerances per matrix: an all-zero
output has error 1.0 against a unit-scale reference).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import touch  # noqa: E402

EXPECT = {"status": "incorrect", "rule": "rel_fro", "catalogue": [16, 17], "device": "cpu", "static": []}


def run(G, steps=5):
    out = torch.zeros_like(G)
    touch(G)
    return out
