"""Catalogue #29: calling the reference implementation.

Trick: the worker has the task's reference module loaded; fetch it from ``sys.modules`` and
call its ``run``.
Expected: ``integrity_violation`` / ``forbidden_op`` (the reference's products show up as
``aten::bmm`` in the dispatch monitor). Static review: ``ast_introspection`` (sys.modules),
``ast_reference_import`` (the module name).
"""
import sys

EXPECT = {"status": "integrity_violation", "rule": "forbidden_op", "catalogue": [29], "device": "cpu",
          "static": ["ast_introspection", "ast_reference_import"], "static_checks": False}


def run(G, steps=5):
    return sys.modules["d2k_task_reference"].run(G, steps)
