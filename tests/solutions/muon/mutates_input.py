"""Fails the untouched-input check: correct output, but scribbles on G."""
import _muon_sf as reference  # the task's straightforward solution, staged next to this file by the tests


def run(G, steps=5):
    out = reference.run(G, steps)
    G[0, 0, 0] = 0.0
    return out
