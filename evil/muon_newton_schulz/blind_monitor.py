"""Catalogue #37 (and #30): blinding the in-process monitors.

Trick: compute with plain PyTorch products (``torch.bmm``), then reach the dispatch monitor's
record through the mode on top of the dispatch-mode stack, ``type(mode).__torch_dispatch__``
and its ``__closure__`` cells (reading them raises no audit event), and clear it; launch one
do-nothing Triton kernel so that the launch counter sees a launch.
Before the profiler backstop this got ``ok`` on the CPU (the GPU's kernel list caught it).
Expected now: ``integrity_violation`` / ``forbidden_op`` on the CPU (the CPU profiler's own list
of ATen ops, kept by PyTorch in C++, shows ``aten::bmm``), ``forbidden_kernel`` on the GPU
(CUPTI's kernel list shows cuBLAS).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import touch  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "forbidden_op|forbidden_kernel", "catalogue": [37, 30], "device": "cpu",
          "static": ["ast_introspection", "ast_forbidden_call"], "static_checks": False, "evidence": "profile"}

_COEFFS = [(8.156554524902461, -22.48329292557795, 15.878769915207462),
           (4.042929935166739, -2.808917465908714, 0.5000178451051316),
           (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
           (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
           (2.3465413258596377, -1.7097828382687081, 0.42323551169305323)]


def _polar(G):
    tall = G.shape[1] > G.shape[2]
    X = (G.mT if tall else G).float()
    X = (X / (X.flatten(1).norm(dim=1)[:, None, None] * 1.02 + 1e-6)).half()
    for a, b, c in _COEFFS:
        A = torch.bmm(X, X.mT)
        B = b * A + c * torch.bmm(A, A)
        X = (a * X.float() + torch.bmm(B, X).float()).half()
    X = X.to(G.dtype)
    return X.mT.contiguous() if tall else X


def _clear_closures(fn, depth: int = 0) -> None:
    """Clear every container reachable through ``fn``'s closure (and the closures of the
    functions found there: PyTorch wraps ``__torch_dispatch__``)."""
    if depth > 4:
        return
    for cell in getattr(fn, "__closure__", None) or ():
        value = cell.cell_contents
        if callable(value) and getattr(value, "__closure__", None):
            _clear_closures(value, depth + 1)
        elif hasattr(value, "clear") and not isinstance(value, type):
            value.clear()


def _blind() -> None:
    from torch.utils import _python_dispatch

    for mode in _python_dispatch._get_current_dispatch_mode_stack():
        _clear_closures(type(mode).__dict__.get("__torch_dispatch__"))


def run(G, steps=5):
    out = _polar(G)
    _blind()
    touch(G)
    return out
