"""Fails the structure check: returns float32 instead of bfloat16."""
from d2kbench.suite.muon_newton_schulz.solutions import straightforward as reference


def run(G, steps=5):
    return reference.run(G, steps).float()
