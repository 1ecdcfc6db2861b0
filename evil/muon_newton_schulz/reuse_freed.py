"""Catalogue #14: reading the reference output's freed memory.

Trick: return ``torch.empty`` and hope the caching allocator hands back the block where the
reference just wrote the right answer (the Sakana "memory exploit"); a do-nothing Triton
kernel is launched so that only the semantic check is in play.
Expected: ``incorrect`` / ``finite``: the reference runs in the parent, never in the worker, and
the worker fills fresh allocations with NaN during correctness calls.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import touch  # noqa: E402

EXPECT = {"status": "incorrect", "rule": "finite", "catalogue": [14], "device": "cpu", "static": []}


def run(G, steps=5):
    out = torch.empty_like(G)
    touch(G)
    return out
