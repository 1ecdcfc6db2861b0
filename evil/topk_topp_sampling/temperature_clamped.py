"""Catalogue #23: correct only inside the workload's usual range of a bounded input.

Trick: the regular workloads draw temperatures in [0.4, 1.2), while the contract
(``value_range: [0.05, 4.0]``) allows any value from 0.05 to 4. Clamp the temperature to
[0.4, 1.2] (e.g. to keep a fixed-point exponent table small): every regular input passes, a
legal temperature of 0.1 or 3 samples another distribution. The element changed before every
CUDA-graph replay is drawn inside the argument's declared range (``value_range``), each tensor
argument as likely as the next, so over the replays the temperatures of the graph's first input
set leave [0.4, 1.2] and the last replay's ids are checked.
Expected (GPU, the regular smoke workload): ``integrity_violation`` / ``graph_replay``. On the
CPU nothing sees it on that workload: no graph, and the sensitivity call never judges an output
checked only by the task's custom check (and picks the tensor it changes by size: three
temperatures next to thousands of logits); the adversarial ``smoke_b8_v300_extreme`` workload
(temperatures 0.05 and 4) fails it as ``incorrect``.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _sampler import sample  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "graph_replay", "catalogue": [23], "device": "cuda", "static": []}


def run(logits, temperature, top_k, top_p, uniforms):
    return sample(logits, temperature, top_k, top_p, uniforms, t_range=(0.4, 1.2))
