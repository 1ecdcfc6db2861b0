"""Catalogue #39 (and #6 of the tool list): the work done on the host.

Trick: view the tensors as numpy arrays, run the whole Polar Express recurrence with numpy on
the host, write the result into the output, and launch one do-nothing Triton kernel so that
``no_triton_launch`` is satisfied.
Before the host-access check this got ``ok`` on the CPU. Expected now: ``integrity_violation``
/ ``host_compute`` (reading tensor data on the host from solution code is refused), and
statically ``ast_host_compute``.
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import touch  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "host_compute", "catalogue": [39], "device": "cpu",
          "static": ["ast_host_compute", "ast_forbidden_call"], "static_checks": False}

_COEFFS = [(8.156554524902461, -22.48329292557795, 15.878769915207462),
           (4.042929935166739, -2.808917465908714, 0.5000178451051316),
           (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
           (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
           (2.3465413258596377, -1.7097828382687081, 0.42323551169305323)]


def run(G, steps=5):
    x = G.cpu().float().numpy()
    tall = x.shape[1] > x.shape[2]
    X = np.swapaxes(x, 1, 2) if tall else x
    X = (X / (np.sqrt((X * X).sum(axis=(1, 2)))[:, None, None] * 1.02 + 1e-6)).astype(np.float16)
    for a, b, c in _COEFFS:
        A = (X.astype(np.float32) @ np.swapaxes(X, 1, 2).astype(np.float32)).astype(np.float16)
        B = (b * A.astype(np.float32) + c * (A.astype(np.float32) @ A.astype(np.float32))).astype(np.float16)
        X = (a * X.astype(np.float32) + (B.astype(np.float32) @ X.astype(np.float32))).astype(np.float16)
    X = np.swapaxes(X, 1, 2) if tall else X
    out = torch.empty_like(G)
    out.copy_(torch.from_numpy(np.ascontiguousarray(X.astype(np.float32))).to(G.dtype))
    touch(G)
    return out
