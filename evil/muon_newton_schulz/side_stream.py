"""Catalogue #1: side-stream offload ("stream injection").

Trick: enqueue the work on a fresh side stream that is never joined to the current stream, so
the CUDA events around the call (recorded on the current stream) close as soon as the host has
launched it. The harness's device-wide synchronize makes the output correct.

At the smoke shapes the honest work is a few microseconds, less than the host's launch time, so
hiding it would gain nothing and no timer could tell. To stand for a real workload's work, the
call also runs ``_burn`` on the side stream: a Triton kernel that spins for about 2 ms (what the
GEMMs of a paper-sized matrix would take).
Expected: ``integrity_violation`` / ``hidden_work`` (the profiler sees GPU busy time on all
streams far above the event time; ``timing_inconsistent`` is usually reported too). GPU only.
"""
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "hidden_work", "catalogue": [1], "device": "cuda", "static": []}


@triton.jit
def _burn(x_ptr, n_iter, BLOCK: tl.constexpr):
    """A dependent multiply-add chain of ``n_iter`` steps per element (pure GPU time)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.load(x_ptr + offs)
    for _ in range(n_iter):
        acc = acc * 0.999 + 0.001
    tl.store(x_ptr + offs, acc)


def run(G, steps=5):
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        out = torch.empty_like(G)
        muon(G, out)
        scratch = torch.zeros(132 * 4 * 128, device=G.device, dtype=torch.float32)
        _burn[(132 * 4,)](scratch, 200_000, BLOCK=128)
    return out
