"""Catalogue #33: exploiting a loose check (only some outputs verified).

Trick: compute the first matrix of the batch properly and the others with one step fewer,
betting that the checker samples or only looks at part of the batch.
Expected: ``incorrect`` / ``reference:rel_fro``: the FP64 oracle check samples matrices, but the
check against the FP16 reference covers every matrix, on every call.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "incorrect", "rule": "reference:rel_fro", "catalogue": [33], "device": "cpu", "static": []}


def run(G, steps=5):
    out = muon(G, steps=4)
    muon(G[:1], out[:1])
    return out
