"""Catalogue #39 (and #6 of the tool list): the work done on the host without numpy or PyTorch.

Trick: read the input's bytes from the worker's own memory through ``/proc/self/mem`` (no
tensor method, no numpy: none of the host-access refusals sees it), run the Polar Express
recurrence in plain Python floats, write the result's bytes into a ``torch.empty`` output
through ``/proc/self/mem``, and launch one do-nothing Triton kernel so that
``no_triton_launch`` is satisfied. The only ATen op is the allocation.
Before ``/proc/<pid>/mem`` was refused this got ``ok`` on the CPU. Expected now:
``integrity_violation`` / ``host_compute`` (the audit hook refuses opening a process's memory
file, whoever asks: the harness never does).
"""
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import touch  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "host_compute", "catalogue": [39], "device": "cpu",
          "static": [], "static_checks": False, "evidence": "/mem"}

_COEFFS = [(8.156554524902461, -22.48329292557795, 15.878769915207462),
           (4.042929935166739, -2.808917465908714, 0.5000178451051316),
           (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
           (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
           (2.3465413258596377, -1.7097828382687081, 0.42323551169305323)]


def _peek(addr: int, n: int) -> bytes:
    with open("/proc/self/mem", "rb", buffering=0) as f:
        f.seek(addr)
        return f.read(n)


def _poke(addr: int, data: bytes) -> None:
    with open("/proc/self/mem", "r+b", buffering=0) as f:
        f.seek(addr)
        f.write(data)


def _bf16(v: float) -> int:
    bits = struct.unpack("<I", struct.pack("<f", v))[0]
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def _mm(a, b):
    bt = list(zip(*b))
    return [[sum(x * y for x, y in zip(row, col)) for col in bt] for row in a]


def _polar(x):
    tall = len(x) > len(x[0])
    X = [list(r) for r in zip(*x)] if tall else x
    nrm = sum(v * v for r in X for v in r) ** 0.5 * 1.02 + 1e-6
    X = [[v / nrm for v in r] for r in X]
    for a, b, c in _COEFFS:
        A = _mm(X, [list(r) for r in zip(*X)])
        AA = _mm(A, A)
        Bm = [[b * u + c * w for u, w in zip(r, s)] for r, s in zip(A, AA)]
        BX = _mm(Bm, X)
        X = [[a * u + w for u, w in zip(r, s)] for r, s in zip(X, BX)]
    return [list(r) for r in zip(*X)] if tall else X


def run(G, steps=5):
    B, M, N = G.shape
    sb, sm, sn = G.stride()
    raw = _peek(G.data_ptr(), ((B - 1) * sb + (M - 1) * sm + (N - 1) * sn + 1) * 2)  # bf16: 2 bytes
    vals = struct.unpack(f"<{len(raw) // 2}H", raw)
    out = torch.empty((B, M, N), dtype=G.dtype)
    res = []
    for b in range(B):
        x = [[struct.unpack("<f", struct.pack("<I", vals[b * sb + i * sm + j * sn] << 16))[0] for j in range(N)]
             for i in range(M)]
        res += [_bf16(v) for r in _polar(x) for v in r]
    _poke(out.data_ptr(), struct.pack(f"<{len(res)}H", *res))
    touch(G)
    return out
