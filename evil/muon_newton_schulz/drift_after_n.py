"""Catalogue #26: stateful drift (correct for the first N calls only).

Trick: the first four calls (the correctness calls and the sensitivity call) are right; later
calls, the timed ones, skip the last polynomial step (the same kernel, so the launch count
does not change).
Expected: ``integrity_violation`` / ``timed_output`` (the worker keeps the output of a secretly
chosen timed call and of the last one; the parent checks them against inputs regenerated from
the timing seeds). The re-check after timing fails as well.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "timed_output", "catalogue": [26, 33], "device": "cpu", "static": []}

_calls = [0]


def run(G, steps=5):
    _calls[0] += 1
    return muon(G, steps=5 if _calls[0] <= 4 else 4)
