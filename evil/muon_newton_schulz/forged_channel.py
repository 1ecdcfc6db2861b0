"""Catalogue #6 and #32: forging the result channel.

Trick: find the worker's pipe (``multiprocessing.current_process()._args``) and write a
result record of our own before the real one.
Expected: ``integrity_violation`` / ``forged_answer`` (every request carries a secret nonce the
worker echoes; solution code cannot read it). Static review: ``ast_forbidden_import``
(multiprocessing), ``ast_introspection`` (current_process).
"""
import multiprocessing
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "forged_answer", "catalogue": [6, 32], "device": "cpu",
          "static": ["ast_forbidden_import", "ast_introspection"]}


def run(G, steps=5):
    out = muon(G)
    conn = multiprocessing.current_process()._args[0]
    conn.send({"kind": "outputs", "outputs": [out.clone()], "types": ["torch.Tensor"], "exact_tensor": [True],
               "subclass": [False], "container": "Tensor", "aliases": [], "violations": []})
    return out
