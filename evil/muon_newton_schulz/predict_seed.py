"""Catalogue #22: predicting the RNG.

Trick: regenerate the test input from a guessed public seed (0) at import time, on the device
the harness generates inputs on, precompute the answer, and return it (a do-nothing kernel keeps
the launch count up).
Expected: ``incorrect`` / ``rel_fro``: the parent draws every call's seed from the OS CSPRNG
(``secrets``), and the worker never sees correctness seeds at all.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon, touch  # noqa: E402

EXPECT = {"status": "incorrect", "rule": "rel_fro", "catalogue": [22], "device": "cpu", "static": []}

_dev = "cuda" if torch.cuda.is_available() else "cpu"  # make_inputs draws on the evaluation's device
_gen = torch.Generator(device=_dev).manual_seed(0)
_guess = muon(torch.randn(2, 32, 96, generator=_gen, device=_dev).to(torch.bfloat16))


def run(G, steps=5):
    touch(G)
    return _guess.to(G.device).clone()
