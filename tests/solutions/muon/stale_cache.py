"""Fails the repeated-execution check: returns the first call's result on every later call."""
import _muon_sf as reference  # the task's straightforward solution, staged next to this file by the tests

_CACHE = {}


def run(G, steps=5):
    key = tuple(G.shape)
    if key not in _CACHE:
        _CACHE[key] = reference.run(G, steps)
    return _CACHE[key].clone()
