"""Catalogue #32 and #6: killing the result pipe.

Trick: close the worker's end of the pipe so that no (failing) result can be reported, hoping
that a missing record is not counted against the solution.
Expected: ``runtime_error`` with "worker died" in the cause (a missing answer is a failure).
Static review: ``ast_forbidden_import``, ``ast_introspection``.
"""
import multiprocessing

EXPECT = {"status": "runtime_error", "rule": "worker died", "catalogue": [32, 6], "device": "cpu",
          "static": ["ast_forbidden_import", "ast_introspection"], "static_checks": False}


def run(G, steps=5):
    multiprocessing.current_process()._args[0].close()
    return G.clone()
