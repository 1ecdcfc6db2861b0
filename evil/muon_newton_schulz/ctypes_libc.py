"""Catalogue #7 (and #30, #10): binary-level tricks through ctypes.

Trick: reach native code through ctypes (the first step of GOT patching, cuBLAS calls or
persisting-L2 windows). Here: load libc and call ``getpid``; the solution swallows the error.
Expected: ``integrity_violation`` / ``ctypes`` (the audit hook refuses ``ctypes.dlopen`` from
solution code and records it even when the solution catches the PermissionError).
Static review: ``ast_forbidden_import``.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "ctypes", "catalogue": [7, 30], "device": "cpu",
          "static": ["ast_forbidden_import"], "static_checks": False}


def run(G, steps=5):
    import ctypes

    try:
        ctypes.CDLL(None).getpid()
    except PermissionError:
        pass
    return muon(G)
