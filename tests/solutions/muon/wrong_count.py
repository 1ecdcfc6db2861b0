"""Fails the output-count check: returns a tuple of two tensors."""
from d2kbench.suite.muon_newton_schulz.solutions import straightforward as reference


def run(G, steps=5):
    out = reference.run(G, steps)
    return out, out.clone()
