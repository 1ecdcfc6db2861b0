"""Fails the numerical check: four polynomial steps instead of five."""
import _muon_sf as sf  # the task's straightforward solution, staged next to this file by the tests


def run(G, steps=5):
    return sf.polar_express(G, sf.COEFFS[:4])
