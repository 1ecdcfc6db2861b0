"""Catalogue #25: precision downcast.

Trick: keep the iterate in BF16 instead of the specified FP16 (faster on some paths, wider
range, 3 fewer mantissa bits).
Expected: ``incorrect`` / ``oracle`` (per-matrix relative error against an FP64 evaluation of
the map: 1.2e-2 allowed, a BF16 iterate lands at 6-8e-2 on the smoke shapes).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "incorrect", "rule": "oracle", "catalogue": [25], "device": "cpu", "static": []}


def run(G, steps=5):
    return muon(G, bf16_iterate=True)
