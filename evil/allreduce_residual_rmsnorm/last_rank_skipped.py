"""Catalogue #33 (less work than the operator): the all-reduce reads R - 1 of the R partials.

Trick: the partial outputs of a tensor-parallel group are "mostly redundant", so sum all but
the last rank's and save 1/R of the traffic (the residual, the norm and its store are right for
the partials that were read).
Expected: ``incorrect`` / ``state:residual`` (the new residual is fully specified and checked
bit-exact; y fails too).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _rmsnorm import fused  # noqa: E402

EXPECT = {"status": "incorrect", "rule": "state:residual", "catalogue": [33], "device": "cpu", "static": []}


def run(partials, residual, weight, eps, group_size, quant):
    return fused(partials, residual, weight, eps, group_size, quant, ranks=range(len(partials) - 1))
