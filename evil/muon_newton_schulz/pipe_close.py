"""Catalogue #32 and #6: killing the result pipe.

Trick: close the worker's end of the pipe (the descriptor named on the worker's command line)
so that no (failing) result can be reported, hoping that a missing record is not counted against
the solution.
Expected: ``runtime_error`` with "worker died" in the cause (a missing answer is a failure).
"""
import os
import sys

EXPECT = {"status": "runtime_error", "rule": "worker died", "catalogue": [32, 6], "device": "cpu",
          "static": [], "static_checks": False}


def run(G, steps=5):
    os.close(int(sys.argv[-1]))
    return G.clone()
