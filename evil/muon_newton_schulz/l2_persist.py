"""Catalogue #10: pinning the working set in L2 to beat the flush.

Trick: raise the persisting-L2 set-aside through the CUDA runtime (cudaDeviceSetLimit with
cudaLimitPersistingL2CacheSize) so an access-policy window survives the harness's flush.
PyTorch has no binding for it, so the solution needs ctypes (or CuPy/cuda-python, both
forbidden libraries).
Expected: ``integrity_violation`` / ``ctypes`` (refused by the audit hook before the library is
even opened, on CPU and GPU alike; on the GPU the set-aside probe, ``l2_persistence``, backs it
up). Static review: ``ast_forbidden_import``, ``ast_l2_persistence``.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "ctypes", "catalogue": [10], "device": "cpu",
          "static": ["ast_forbidden_import", "ast_l2_persistence"], "static_checks": False}

_done = []


def run(G, steps=5):
    if not _done:
        _done.append(1)
        import ctypes

        try:
            rt = ctypes.CDLL("libcudart.so.12")
            rt.cudaDeviceSetLimit(0x06, 32 << 20)  # cudaLimitPersistingL2CacheSize
        except (OSError, PermissionError):
            pass
    return muon(G)
