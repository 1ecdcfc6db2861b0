"""Fails the finite check: one NaN in an otherwise correct output."""
from d2kbench.suite.muon_newton_schulz.solutions import straightforward as reference


def run(G, steps=5):
    out = reference.run(G, steps)
    out[0, 0, 0] = float("nan")
    return out
