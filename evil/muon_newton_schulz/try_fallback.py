"""Catalogue #28: try/except fallback to PyTorch.

Trick: the Triton path fails (here: on purpose, for shapes it does not support) and an
exception handler quietly computes the answer with PyTorch products.
Expected: ``integrity_violation`` / ``forbidden_op`` at run time (the fallback ran ``aten::bmm``);
the static review reports ``ast_try_fallback`` and ``ast_forbidden_call``.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "forbidden_op", "catalogue": [28], "device": "cpu",
          "static": ["ast_try_fallback", "ast_forbidden_call"], "static_checks": False}


def _torch_muon(G):
    X = G.float()
    X = (X / (X.flatten(1).norm(dim=1).view(-1, 1, 1) * 1.02 + 1e-6)).half()
    for a, b, c in ((8.156554524902461, -22.48329292557795, 15.878769915207462),
                    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
                    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
                    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
                    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323)):
        A = X @ X.mT
        X = a * X + (b * A + c * (A @ A)) @ X
    return X.to(torch.bfloat16)


def run(G, steps=5):
    try:
        if G.shape[2] < 128:
            raise RuntimeError("unsupported tile")
        return muon(G)
    except RuntimeError:
        return torch.matmul(torch.eye(G.shape[1], dtype=torch.float32), _torch_muon(G).float()).to(torch.bfloat16)
