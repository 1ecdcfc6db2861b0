"""Catalogue #23: overfitting to the visible shapes.

Trick: a real kernel only for the shape the author saw ([2, 32, 96]); anything else gets a
cheap placeholder (zeros).
Expected: ``incorrect`` / ``rel_fro`` on another registered shape (every task has several
workloads plus smoke and adversarial shapes; all must pass).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon, touch  # noqa: E402

EXPECT = {"status": "incorrect", "rule": "rel_fro", "catalogue": [23], "device": "cpu", "static": [],
          "workloads": ["smoke_square_3x40x40"]}


def run(G, steps=5):
    if tuple(G.shape) == (2, 32, 96):
        return muon(G)
    touch(G)
    return torch.zeros_like(G)
