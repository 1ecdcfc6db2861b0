"""Integrity violation: returns a torch.Tensor subclass instead of a plain tensor."""
import torch

from d2kbench.suite.muon_newton_schulz.solutions import straightforward as reference


class Lazy(torch.Tensor):
    pass


def run(G, steps=5):
    return reference.run(G, steps).as_subclass(Lazy)
