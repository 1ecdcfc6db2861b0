"""Must fail the tolerance: a wrong normalisation, G / ||G||_F without the 1.02 safety factor."""
import _muon_sf as sf  # the task's straightforward solution, staged next to this file by the tests


def run(G, steps=5):
    return sf.polar_express(G, sf.COEFFS, norm_scale=1.0)
