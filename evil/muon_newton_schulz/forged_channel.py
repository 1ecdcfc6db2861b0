"""Catalogue #6 and #32: forging the result channel.

Trick: find the worker's pipe (the descriptor named on the worker's command line) and write a
result record of our own on it before the real one.
Expected: ``integrity_violation`` / ``forged_answer`` (every request carries a secret nonce the
worker echoes; solution code cannot read it). Static review: ``ast_forbidden_import``
(multiprocessing).
"""
import os
import sys
from multiprocessing.connection import Connection

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "forged_answer", "catalogue": [6, 32], "device": "cpu",
          "static": ["ast_forbidden_import"]}


def _pipe() -> Connection:
    return Connection(os.dup(int(sys.argv[-1])))


def run(G, steps=5):
    out = muon(G)
    _pipe().send({"kind": "outputs", "outputs": [out.clone()], "types": ["torch.Tensor"], "exact_tensor": [True],
                  "subclass": [False], "container": "Tensor", "aliases": [], "violations": []})
    return out
