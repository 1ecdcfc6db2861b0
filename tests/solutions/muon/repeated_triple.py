"""Must fail the tolerance: the second coefficient triple is repeated in place of the third."""
import _muon_sf as sf  # the task's straightforward solution, staged next to this file by the tests

C = sf.COEFFS


def run(G, steps=5):
    return sf.polar_express(G, (C[0], C[1], C[1], C[3], C[4]))
