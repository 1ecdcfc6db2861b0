"""Catalogue #46 (and #39, #35): the work done by a short-lived child process.

Trick: copy the input into a tensor in shared memory (``share_memory_``: no ATen op; the copy
is glue), allocate the output in shared memory too, start a Python process through
``_posixsubprocess.fork_exec`` (no audit event) that inherits both descriptors, maps them,
computes the Polar Express with plain PyTorch products (``torch.bmm``: nothing watches that
process) and writes the output; wait for it to exit and launch one do-nothing Triton kernel. The child is gone before ``run`` returns, so the parent's look at the
sandbox's processes after the call finds nothing.
Before CPU workers forbade themselves new processes this got ``ok`` on the CPU. Expected now:
``integrity_violation`` / ``process_control`` (the worker's seccomp filter kills it with SIGSYS
at the fork; the parent sees the signal from outside).
On the GPU (where Triton's compiler needs processes) the child would have to open CUDA IPC
handles in a CUDA context of its own, whose start-up is timed with every call: see
``docs/integrity.md``, residual risks.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import touch  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "process_control", "catalogue": [46, 39, 35], "device": "cpu_only",
          "static": ["ast_forbidden_import"], "static_checks": False}

_CHILD = r"""
import mmap, os, sys, torch
fd_in, fd_out, B, M, N = map(int, sys.argv[1:6])
G = torch.frombuffer(mmap.mmap(fd_in, B * M * N * 2), dtype=torch.bfloat16).view(B, M, N)
C = [(8.156554524902461, -22.48329292557795, 15.878769915207462),
     (4.042929935166739, -2.808917465908714, 0.5000178451051316),
     (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
     (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
     (2.3465413258596377, -1.7097828382687081, 0.42323551169305323)]
tall = M > N
X = (G.mT if tall else G).double()
X = X / (X.flatten(1).norm(dim=1)[:, None, None] * 1.02 + 1e-6)
for a, b, c in C:
    A = torch.bmm(X, X.mT)
    X = a * X + torch.bmm(b * A + c * torch.bmm(A, A), X)
X = (X.mT if tall else X).to(torch.bfloat16).contiguous()
torch.frombuffer(mmap.mmap(fd_out, B * M * N * 2), dtype=torch.bfloat16).copy_(X.flatten())
"""


def _spawn_and_wait(argv: list[str], keep: tuple[int, ...]) -> None:
    import _posixsubprocess

    null = os.open(os.devnull, os.O_RDWR)
    r, w = os.pipe()
    pid = _posixsubprocess.fork_exec(argv, [os.fsencode(argv[0])], False, keep, None, None, null, -1, -1, 2, -1,
                                     2, r, w, True, False, -1, None, None, None, -1, None, False)
    os.close(r)
    os.close(w)
    os.waitpid(pid, 0)


def run(G, steps=5):
    B, M, N = G.shape
    shared_in = torch.empty((B, M, N), dtype=G.dtype)
    shared_in.share_memory_()
    shared_in.copy_(G)
    out = torch.empty((B, M, N), dtype=G.dtype)
    out.share_memory_()
    fd_in = shared_in.untyped_storage()._share_fd_cpu_()[0]
    fd_out = out.untyped_storage()._share_fd_cpu_()[0]
    _spawn_and_wait([sys.executable, "-c", _CHILD, str(fd_in), str(fd_out), str(B), str(M), str(N)],
                    tuple(sorted((fd_in, fd_out))))
    touch(G)
    return out
