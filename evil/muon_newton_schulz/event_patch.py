"""Catalogue #4: monkeypatching the CUDA event timer.

Trick: replace ``torch.cuda.Event.elapsed_time`` so that every event pair reads 1 ns. The class
exists on CPU builds too, so the patch is caught on the CPU as well as on the H200 (where the
roofline floor, ``below_sol_floor``, would reject the forged time independently).
Expected: ``integrity_violation`` / ``monkeypatch``. Static review: ``ast_monkeypatch``.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "monkeypatch", "catalogue": [4, 5], "device": "cpu",
          "static": ["ast_monkeypatch"], "static_checks": False, "evidence": "elapsed_time"}

torch.cuda.Event.elapsed_time = lambda self, end: 1e-6


def run(G, steps=5):
    return muon(G)
