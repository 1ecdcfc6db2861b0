"""Fails the output-count check: returns a tuple of two tensors."""
import _muon_sf as reference  # the task's straightforward solution, staged next to this file by the tests


def run(G, steps=5):
    out = reference.run(G, steps)
    return out, out.clone()
