"""Must fail the tolerance: the second coefficient triple is repeated in place of the third."""
from d2kbench.suite.muon_newton_schulz.solutions import straightforward as sf

C = sf.COEFFS


def run(G, steps=5):
    return sf.polar_express(G, (C[0], C[1], C[1], C[3], C[4]))
