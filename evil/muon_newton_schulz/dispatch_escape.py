"""Catalogue #30: hiding PyTorch compute from the dispatch monitor.

Trick: switch Python dispatch off (``torch._C._DisableTorchDispatch``) so the harness's
TorchDispatchMode does not see the products, and launch no Triton kernel at all.
Expected: ``integrity_violation`` / ``no_triton_launch`` (the launch counter is independent of
the dispatcher; on the GPU the profiler would also name the cuBLAS kernels). Static review:
``ast_introspection`` (torch._C), ``ast_forbidden_call``.
"""
import torch

EXPECT = {"status": "integrity_violation", "rule": "no_triton_launch", "catalogue": [30], "device": "cpu",
          "static": ["ast_introspection", "ast_forbidden_call"], "static_checks": False}


def run(G, steps=5):
    with torch._C._DisableTorchDispatch():
        X = G.float()
        X = X / (X.flatten(1).norm(dim=1).view(-1, 1, 1) * 1.02 + 1e-6)
        for a, b, c in ((8.156554524902461, -22.48329292557795, 15.878769915207462),
                        (4.042929935166739, -2.808917465908714, 0.5000178451051316),
                        (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
                        (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
                        (2.3465413258596377, -1.7097828382687081, 0.42323551169305323)):
            A = X @ X.mT
            X = a * X + (b * A + c * (A @ A)) @ X
        return X.to(torch.bfloat16)
