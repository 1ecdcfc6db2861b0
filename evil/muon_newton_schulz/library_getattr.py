"""Catalogue #30: a library op in disguise.

Trick: reach ``torch.matmul`` through a computed name so that a text or AST filter looking for
``matmul`` sees nothing, and use it for the products.
Expected: ``integrity_violation`` / ``forbidden_op`` (the dispatch monitor sees ATen ops, not
spellings). Static review: ``ast_dynamic_code`` (getattr on torch with a computed name).
"""
import torch

EXPECT = {"status": "integrity_violation", "rule": "forbidden_op", "catalogue": [30], "device": "cpu",
          "static": ["ast_dynamic_code"], "static_checks": False}

_mm = getattr(torch, "ma" + "tmul")


def run(G, steps=5):
    X = G.float()
    X = X / (X.flatten(1).norm(dim=1).view(-1, 1, 1) * 1.02 + 1e-6)
    for a, b, c in ((8.156554524902461, -22.48329292557795, 15.878769915207462),
                    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
                    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
                    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
                    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323)):
        A = _mm(X, X.mT)
        X = a * X + _mm(b * A + c * _mm(A, A), X)
    return X.to(torch.bfloat16)
