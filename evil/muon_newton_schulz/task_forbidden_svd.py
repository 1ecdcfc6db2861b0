"""Catalogue #30 (task rule): a decomposition the task forbids.

Trick: orthogonalise through an SVD (the exact polar factor ``U V^T``) instead of the five
polynomial steps; Muon's ``task.yaml`` forbids SVD/eigen/QR (``forbidden.aten_ops``).
Expected: ``integrity_violation`` / ``forbidden_op`` with ``aten::_linalg_svd`` in the evidence.
Static review: ``ast_forbidden_call``.
"""
import torch

EXPECT = {"status": "integrity_violation", "rule": "forbidden_op", "catalogue": [30], "device": "cpu",
          "static": ["ast_forbidden_call"], "static_checks": False, "evidence": "_linalg_svd"}


def run(G, steps=5):
    U, S, Vh = torch.linalg.svd(G.float(), full_matrices=False)  # U @ Vh would be the polar factor
    return torch.zeros_like(G)
