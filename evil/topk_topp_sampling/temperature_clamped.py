"""Catalogue #23: correct only inside the workload's usual range of a bounded input.

Trick: the regular workloads draw temperatures in [0.4, 1.2), while the contract
(``value_range: [0.05, 4.0]``) allows any value from 0.05 to 4. Clamp the temperature to
[0.4, 1.2] (e.g. to keep a fixed-point exponent table small): every regular input passes, a
legal temperature of 0.1 or 3 samples another distribution.
Expected (CPU and GPU): ``incorrect`` on the adversarial smoke workload ``smoke_b8_v300_extreme``
(temperatures 0.05 and 4), the defence this catalogue entry relies on: workloads that cover the
declared range. The changes made to the inputs before each CUDA-graph replay do not catch it
reliably: on the H200 (2026-12-03) the regular smoke workload passed the last-replay check both
when one argument was changed per replay and when every argument was (the id a clamped
temperature gives often equals the right one: the top-k set does not depend on the temperature,
and the inverse CDF of a few candidates moves little).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _sampler import sample  # noqa: E402

EXPECT = {"status": "incorrect", "rule": "ids", "catalogue": [23], "device": "cpu", "static": [],
          "workloads": ["smoke_b8_v300_extreme"]}


def run(logits, temperature, top_k, top_p, uniforms):
    return sample(logits, temperature, top_k, top_p, uniforms, t_range=(0.4, 1.2))
