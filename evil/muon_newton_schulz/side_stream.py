"""Catalogue #1: side-stream offload ("stream injection").

Trick: enqueue the work on a fresh side stream that is never joined to the current stream, so
the CUDA events around the call close almost at once (the work is repeated 20 times to make it
clearly measurable). The harness's device-wide synchronize makes the output correct.
Expected: ``integrity_violation`` / ``hidden_work`` (the profiler sees GPU busy time on all
streams far above the event time; ``timing_inconsistent`` is usually reported too). GPU only.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "hidden_work", "catalogue": [1], "device": "cuda", "static": []}


def run(G, steps=5):
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        out = torch.empty_like(G)
        for _ in range(20):
            muon(G, out)
    return out
