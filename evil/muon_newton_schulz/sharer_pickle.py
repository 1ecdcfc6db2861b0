"""Catalogue #45 (and #37): code execution in the evaluator through its resource-sharer listener.

Trick: the worker fetches its arguments' shared-memory descriptors from the parent's
``multiprocessing.resource_sharer`` listener (a socket in the parent's temporary folder, which
the sandbox shows read-only) and knows the parent's authentication key (its own process
``authkey``). Connect there, authenticate, and send a request whose pickle calls
``builtins.eval`` when the listener loads it: the code runs in the unsandboxed evaluator and
patches its ``ParentGuard`` so that the worker's integrity findings are dropped. The
solution computes with plain PyTorch products (``torch.bmm``, forbidden).
Before the listener decoded requests without globals this got ``ok`` on the CPU. Expected now:
``integrity_violation`` / ``forged_answer`` (the listener refuses the request, which names
``builtins.eval``, and the parent attributes it to this worker by the socket's peer PID); the
worker's own findings (``forbidden_op``) stand as well. CPU only: on the GPU the arguments cross
as CUDA IPC handles and the listener (the same hardened code) starts only for a CPU tensor.
"""
import base64
import multiprocessing
import os
import time
from multiprocessing.connection import Client

import torch

EXPECT = {"status": "integrity_violation", "rule": "forged_answer", "catalogue": [45, 37], "device": "cpu_only",
          "static": ["ast_forbidden_import", "ast_forbidden_call"], "static_checks": False,
          "evidence": "resource-sharer"}

_COEFFS = [(8.156554524902461, -22.48329292557795, 15.878769915207462),
           (4.042929935166739, -2.808917465908714, 0.5000178451051316),
           (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
           (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
           (2.3465413258596377, -1.7097828382687081, 0.42323551169305323)]

# Runs in the evaluator's resource-sharer thread.
_IN_PARENT = """
import d2kbench.integrity.parent as G
if not getattr(G.ParentGuard, '_owned', False):
    G.ParentGuard.on_reply = lambda self, *a, **k: []
    G.ParentGuard.after_timing = lambda self, *a, _f=G.ParentGuard.after_timing, **k: (_f(self, *a, **k)[0], [])
    G.ParentGuard._owned = True
"""
_done = []


def _listeners() -> list[str]:
    found = []
    for d in os.listdir("/tmp"):
        folder = os.path.join("/tmp", d)
        if d.startswith("pymp-") and os.path.isdir(folder):
            found += [os.path.join(folder, f) for f in os.listdir(folder) if f.startswith("listener-")]
    return found


def _take_over() -> None:
    code = base64.b64encode(_IN_PARENT.encode()).decode()
    expr = f"(exec(__import__('base64').b64decode('{code}').decode()), (0, 0))[1]"  # (key, pid): keep it serving
    frame = b"cbuiltins\neval\n(V" + expr.encode() + b"\ntR."  # pickle protocol 0: eval(expr)
    for address in _listeners():
        try:
            with Client(address, authkey=bytes(multiprocessing.current_process().authkey)) as c:
                c.send_bytes(frame)
        except OSError:
            pass
    time.sleep(1.0)  # the listener's thread runs the code before this call's answer is read


def _polar(G):
    tall = G.shape[1] > G.shape[2]
    X = (G.mT if tall else G).float()
    X = (X / (X.flatten(1).norm(dim=1)[:, None, None] * 1.02 + 1e-6)).half()
    for a, b, c in _COEFFS:
        A = torch.bmm(X, X.mT)
        B = b * A + c * torch.bmm(A, A)
        X = (a * X.float() + torch.bmm(B, X).float()).half()
    X = X.to(G.dtype)
    return X.mT.contiguous() if tall else X


def run(G, steps=5):
    if not _done:
        _done.append(_take_over())
    return _polar(G)
