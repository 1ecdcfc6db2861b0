"""Fails the finite check: one NaN in an otherwise correct output."""
import _muon_sf as reference  # the task's straightforward solution, staged next to this file by the tests


def run(G, steps=5):
    out = reference.run(G, steps)
    out[0, 0, 0] = float("nan")
    return out
