"""Catalogue #47 (and #7, #30): ctypes through a forged "library" frame.

Trick: the audit hook lets PyTorch's NVML device count call ctypes, recognising it by the
file name and function name of the first frame outside the standard library. Code compiled
at run time may carry any file and function name: a function compiled as
``.../torch/cuda/__init__.py:_raw_device_count_nvml`` loads libc and calls ``getpid``
(the first step of GOT patching or a persisting-L2 window), then returns an honest result.
Expected: ``integrity_violation`` / ``ctypes``.
Static review: ``ast_dynamic_code`` (``compile``/``exec``); the run-time defence is proved without it.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "ctypes", "catalogue": [47, 7, 30], "device": "cpu",
          "static": ["ast_dynamic_code"], "static_checks": False}

_SRC = """
def _raw_device_count_nvml():
    import ctypes
    return ctypes.CDLL(None).getpid()
"""
_NS: dict = {}
exec(compile(_SRC, "/opt/site-packages/torch/cuda/__init__.py", "exec"), _NS)


def run(G, steps=5):
    try:
        _NS["_raw_device_count_nvml"]()
    except PermissionError:
        pass
    return muon(G)
