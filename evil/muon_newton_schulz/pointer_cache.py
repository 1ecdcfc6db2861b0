"""Catalogue #9 and #13: batch-and-skip / pointer-keyed result cache during timing.

Trick: the correctness calls come first, so the first four calls are honest; afterwards the
output is cached by the input's address. Timing reuses a few input sets at fixed addresses, so
every later timed call is a dictionary lookup that launches nothing.
Expected: ``integrity_violation`` / ``launch_mismatch`` (timed calls on one input set launched
different Triton kernels; ``no_triton_launch`` is reported too).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "launch_mismatch", "catalogue": [9, 13], "device": "cpu",
          "static": []}

_calls = [0]
_cache = {}


def run(G, steps=5):
    _calls[0] += 1
    key = G.data_ptr()
    if _calls[0] > 4 and key in _cache:
        return _cache[key].clone()
    out = muon(G)
    _cache[key] = out
    return out
