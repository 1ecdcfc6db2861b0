"""Must fail the tolerance: a wrong normalisation, G / ||G||_F without the 1.02 safety factor."""
from d2kbench.suite.muon_newton_schulz.solutions import straightforward as sf


def run(G, steps=5):
    return sf.polar_express(G, sf.COEFFS, norm_scale=1.0)
