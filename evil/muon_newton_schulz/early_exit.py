"""Catalogue #32: early exit hoping that exit code 0 means success.

Trick: ``os._exit(0)`` inside ``run`` before any result is reported.
Expected: ``runtime_error`` with "exit code 0" in the cause (success needs a positive result
record for every request; a dead worker is a failure). Static review: ``ast_process_control``.
"""
import os

EXPECT = {"status": "runtime_error", "rule": "exit code 0", "catalogue": [32], "device": "cpu",
          "static": ["ast_process_control"], "static_checks": False}


def run(G, steps=5):
    os._exit(0)
