"""Catalogue #13: replaying a cached result keyed by a cheap content fingerprint.

Trick: fresh data at fresh addresses defeats pointer keys, so key the cache by the shape and
the first element instead: every fresh random input misses, but an input that differs from the
previous one in a single element hits and gets the previous output back.
Expected: ``integrity_violation`` / ``stale_output`` (the parent's sensitivity call changes one
secretly chosen element; the output stays bit-identical although the reference moved) or
``no_triton_launch`` (the cache hit on that call launches no kernel; the worker may report this
first and end the call before the parent compares outputs).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "stale_output|no_triton_launch", "catalogue": [13], "device": "cpu",
          "static": []}

_cache = {}


def run(G, steps=5):
    key = (tuple(G.shape), float(G[0, 0, 0]))
    if key not in _cache:
        _cache.clear()
        _cache[key] = muon(G)
    return _cache[key].clone()
