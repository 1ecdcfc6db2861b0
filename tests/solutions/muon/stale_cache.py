"""Fails the repeated-execution check: returns the first call's result on every later call."""
from d2kbench.suite.muon_newton_schulz.solutions import straightforward as reference

_CACHE = {}


def run(G, steps=5):
    key = tuple(G.shape)
    if key not in _CACHE:
        _CACHE[key] = reference.run(G, steps)
    return _CACHE[key].clone()
