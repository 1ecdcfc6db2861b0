"""Catalogue #42 (and #13, #26): returning storage kept across calls.

Trick: keep one output buffer per input shape, recompute into it on every call and return it:
no allocation per call, and the caller's earlier results silently change with each later call
(a timing loop that keeps references to outputs sees only the last call's values).
Before the storage-reuse check this was caught only when the randomly kept timed output came
from another input set than the last call. Expected now: ``integrity_violation`` /
``output_reuse`` (an output's storage is that of an earlier call's output the harness still
holds), on every workload.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "output_reuse", "catalogue": [42, 13, 26], "device": "cpu",
          "static": []}

_buffers = {}


def run(G, steps=5):
    buf = _buffers.get(G.shape)
    if buf is None:
        buf = _buffers[G.shape] = torch.empty_like(G)
    return muon(G, out=buf)
