"""Catalogue #41 (and #9, #13): a smaller grid on a cache hit.

Trick: cache results by the input's address and a fingerprint of a few of its values. On a hit
(timed calls reuse a few input sets at fixed addresses), launch the same Triton kernel again,
but on a one-program grid that recomputes only the first matrix into a copy of the cached
result: the same kernel name and launch count as an honest call, a fraction of the work.
Before grids were part of the launch signature this got ``ok``. Expected now:
``integrity_violation`` / ``launch_mismatch`` (timed calls on one input set launched the kernel
on different grids).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "launch_mismatch", "catalogue": [41, 9, 13], "device": "cpu",
          "static": [], "evidence": "grids"}

_cache = {}


def _key(G):
    flat = G.reshape(-1)
    return G.data_ptr(), tuple(float(flat[i]) for i in range(0, flat.numel(), max(1, flat.numel() // 8)))


def run(G, steps=5):
    key = _key(G)
    if key in _cache:
        out = _cache[key].clone()
        return muon(G, out=out, batches=1)
    out = muon(G)
    _cache[key] = out.clone()
    return out
