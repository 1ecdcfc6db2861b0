"""Must fail the tolerance: the iterate is stored in BF16 instead of FP16 (Triton, step-wise)."""
import torch

import _muon_sf as sf  # the task's straightforward solution, staged next to this file by the tests


def run(G, steps=5):
    return sf.polar_express(G, sf.COEFFS, iterate_dtype=torch.bfloat16)
