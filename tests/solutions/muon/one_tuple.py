"""Fails the container check: returns its single output inside a 1-tuple (the contract: bare)."""
import _muon_sf as reference  # the task's straightforward solution, staged next to this file by the tests


def run(G, steps=5):
    return (reference.run(G, steps),)
