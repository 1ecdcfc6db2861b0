"""Integrity violation: returns a torch.Tensor subclass instead of a plain tensor."""
import torch

import _muon_sf as reference  # the task's straightforward solution, staged next to this file by the tests


class Lazy(torch.Tensor):
    pass


def run(G, steps=5):
    return reference.run(G, steps).as_subclass(Lazy)
