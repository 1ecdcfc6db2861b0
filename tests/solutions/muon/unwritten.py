"""Fails through the NaN poison: the last row of every matrix is never written."""
import torch

import _muon_sf as reference  # the task's straightforward solution, staged next to this file by the tests


def run(G, steps=5):
    full = reference.run(G, steps)
    out = torch.empty_like(full)
    out[:, :-1, :] = full[:, :-1, :]
    return out
