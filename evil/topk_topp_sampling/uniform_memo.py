"""Catalogue #13 and #41: replaying a cached result keyed by the request's random draw, in device memory.

Trick: a decode step's sample is "determined" by its uniform, so keep a table of (uniform, id)
pairs per request in device memory (64 slots, picked by the uniform's low bits: each input set
of a timing loop or a CUDA graph keeps its own entry) and, when a request's uniform comes again
bit-identical, store the remembered id without reading the logits. Everything stays on the
device (no host read of a key, the same kernel launched on every call: the launch signature
never changes), so a repeated timed call or a graph's later passes over its input sets skip
the rows. Fresh inputs (every correctness call) miss; the sensitivity call, which changes
logits (or a temperature or top-p) of the previous call's inputs and keeps the uniforms, hits
and gets the old ids.
Expected: ``integrity_violation`` / ``stale_output`` (on the GPU also ``graph_replay``: before every
replay one element of the graph's first input set changes, a uniform only one time in four, so
its last replay can serve remembered ids for changed rows). NOT REJECTED YET: measured ``ok`` on the
CPU, because the sensitivity call never judges an output checked only by a task's custom check
(``integrity/parent.py`` ``_moved_outputs`` skips ``metric: custom``; the ids are such an
output), so it is skipped as "nothing moved the reference" and no other check can tell.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _sampler import sample  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "stale_output|graph_replay", "catalogue": [13, 41], "device": "cpu",
          "static": []}


def run(logits, temperature, top_k, top_p, uniforms):
    return sample(logits, temperature, top_k, top_p, uniforms, memo=True)
