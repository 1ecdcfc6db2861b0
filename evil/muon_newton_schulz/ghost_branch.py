"""Catalogue #24: a ghost optimisation branch.

Trick: the Triton path exists but only runs for shapes that never occur; the work really
happens in a PyTorch fallback (``@``, cuBLAS on the GPU).
Expected: ``integrity_violation`` / ``forbidden_op`` (the TorchDispatchMode sees ``aten::bmm``
inside ``run``). Evaluated without the AST rules; the static review reports ``ast_forbidden_call``.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "forbidden_op", "catalogue": [24, 30], "device": "cpu",
          "static": ["ast_forbidden_call"], "static_checks": False, "evidence": "aten::bmm"}

COEFFS = ((8.156554524902461, -22.48329292557795, 15.878769915207462),
          (4.042929935166739, -2.808917465908714, 0.5000178451051316),
          (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
          (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
          (2.3465413258596377, -1.7097828382687081, 0.42323551169305323))


def run(G, steps=5):
    if G.shape[1] * G.shape[2] > 1 << 40:  # never true
        return muon(G)
    tall = G.shape[1] > G.shape[2]
    X = (G.mT if tall else G).float()
    X = (X / (X.flatten(1).norm(dim=1).view(-1, 1, 1) * 1.02 + 1e-6)).half()
    for a, b, c in COEFFS:
        A = X @ X.mT
        X = a * X + (b * A + c * (A @ A)) @ X
    return (X.mT if tall else X).to(torch.bfloat16).contiguous()
