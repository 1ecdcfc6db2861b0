"""Must fail the tolerance: the iterate is stored in BF16 instead of FP16 (Triton, step-wise)."""
import torch

from d2kbench.suite.muon_newton_schulz.solutions import straightforward as sf


def run(G, steps=5):
    return sf.polar_express(G, sf.COEFFS, iterate_dtype=torch.bfloat16)
