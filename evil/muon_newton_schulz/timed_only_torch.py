"""Catalogue #40 (and #24): PyTorch compute only while being timed.

Trick: tell a checked call from a timed one by PyTorch's global state (correctness calls run in
deterministic mode with new memory filled with NaN; timed calls used to run without
deterministic mode and now run without the fill). When timed, compute with ``torch.bmm``
(correct values, a forbidden vendor product) and launch one do-nothing Triton kernel; when
checked, run the honest Triton kernel.
Before timed calls were monitored this got ``ok`` on the CPU. Expected now:
``integrity_violation`` / ``forbidden_op`` (timed calls run under the same dispatch monitor as
checked ones).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon, touch  # noqa: E402
from blind_monitor import _polar  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "forbidden_op", "catalogue": [40, 24], "device": "cpu",
          "static": ["ast_forbidden_call"], "static_checks": False, "evidence": "timed calls"}


def _checked() -> bool:
    return torch.are_deterministic_algorithms_enabled() and torch.utils.deterministic.fill_uninitialized_memory


def run(G, steps=5):
    if _checked():
        return muon(G)
    out = _polar(G)
    touch(G)
    return out
