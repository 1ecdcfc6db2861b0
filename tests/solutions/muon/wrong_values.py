"""Fails the numerical check: four polynomial steps instead of five."""
from d2kbench.suite.muon_newton_schulz.solutions import straightforward as sf


def run(G, steps=5):
    return sf.polar_express(G, sf.COEFFS[:4])
