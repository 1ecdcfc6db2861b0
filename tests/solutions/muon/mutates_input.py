"""Fails the untouched-input check: correct output, but scribbles on G."""
from d2kbench.suite.muon_newton_schulz.solutions import straightforward as reference


def run(G, steps=5):
    out = reference.run(G, steps)
    G[0, 0, 0] = 0.0
    return out
