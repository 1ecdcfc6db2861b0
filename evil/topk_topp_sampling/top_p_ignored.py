"""Catalogue #33 (a simplified operator that a loose check might accept): top-p ignored.

Trick: apply the temperature and top-k, skip the nucleus cut (the sorting-free top-p is the
hard part of the task), and sample the top-k distribution. On the flat top-p workload (N(0, 1)
logits, p in [0.7, 0.98), k = V) the nucleus leaves out 2-30 % of the mass, so the inverse CDF
of the same uniform lands on another token in most rows.
Expected: ``incorrect`` / ``ids`` (the custom check rebuilds the kept set in float64).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _sampler import sample  # noqa: E402

EXPECT = {"status": "incorrect", "rule": "ids", "catalogue": [33], "device": "cpu", "static": [],
          "workloads": ["smoke_b3_v600_flat_p"]}


def run(logits, temperature, top_k, top_p, uniforms):
    return sample(logits, temperature, top_k, top_p, uniforms, use_p=False)
