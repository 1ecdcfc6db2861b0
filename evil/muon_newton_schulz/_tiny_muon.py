"""Shared helper of the evil Muon solutions (not a solution itself: names starting with ``_``
are skipped by the evil-suite runner).

An *honest* one-kernel Triton Muon for the small smoke shapes (one program per matrix; the
wide iterate must fit a 64 x 128 tile), so that each evil file can be honest in everything
but the one trick it demonstrates, and cheap under ``TRITON_INTERPRET=1``. The static rules
review this file too (it is imported from the solution's folder); it is clean.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _round(v, BF16: tl.constexpr):
    """Round to the iterate's storage precision: FP16, or BF16 (held in FP16 registers)."""
    if BF16:
        return v.to(tl.bfloat16).to(tl.float16)
    return v.to(tl.float16)


@triton.jit
def _step(x, a, b, c, BF16: tl.constexpr):
    """One Polar Express step on the register-resident iterate: X = a X + (b A + c A^2) X."""
    A = _round(tl.dot(x, tl.trans(x)), BF16)
    AA = _round(tl.dot(A, A), BF16)
    Bm = _round(b * A.to(tl.float32) + c * AA.to(tl.float32), BF16)
    return _round(a * x.to(tl.float32) + _round(tl.dot(Bm, x), BF16).to(tl.float32), BF16)


@triton.jit
def _tiny_muon_kernel(g_ptr, o_ptr, R, C, sgb, sgr, sgc, sob, sor, soc,
                      BR: tl.constexpr, BC: tl.constexpr, BF16: tl.constexpr, STEPS: tl.constexpr):
    b = tl.program_id(0)
    rr = tl.arange(0, BR)
    cc = tl.arange(0, BC)
    mask = (rr[:, None] < R) & (cc[None, :] < C)
    g = tl.load(g_ptr + b * sgb + rr[:, None] * sgr + cc[None, :] * sgc, mask=mask, other=0.0).to(tl.float32)
    nrm = tl.sqrt(tl.sum(tl.sum(g * g, axis=1), axis=0))
    x = _round(g / (nrm * 1.02 + 1e-6), BF16)
    x = _step(x, 8.156554524902461, -22.48329292557795, 15.878769915207462, BF16)
    if STEPS > 1:
        x = _step(x, 4.042929935166739, -2.808917465908714, 0.5000178451051316, BF16)
    if STEPS > 2:
        x = _step(x, 3.8916678022926607, -2.772484153217685, 0.5060648178503393, BF16)
    if STEPS > 3:
        x = _step(x, 3.285753657755655, -2.3681294933425376, 0.46449024233003106, BF16)
    if STEPS > 4:
        x = _step(x, 2.3465413258596377, -1.7097828382687081, 0.42323551169305323, BF16)
    tl.store(o_ptr + b * sob + rr[:, None] * sor + cc[None, :] * soc, x.to(tl.bfloat16), mask=mask)


@triton.jit
def _touch_kernel(x_ptr):
    """Does nothing useful: lets a trick launch "a Triton kernel" without doing the work."""
    tl.load(x_ptr)


def _pow2(n: int) -> int:
    return max(16, 1 << (max(1, n) - 1).bit_length())


def muon(G: torch.Tensor, out: torch.Tensor | None = None, steps: int = 5, bf16_iterate: bool = False,
         batches: int | None = None) -> torch.Tensor:
    """Muon of ``G`` [B, M, N] bf16 (small shapes only) into ``out`` (a new tensor by default).

    ``steps`` < 5 or ``bf16_iterate=True`` give the *wrong* maps some tricks need;
    ``batches`` < B computes only the first matrices.
    """
    B, M, N = G.shape
    tall = M > N
    gv = G.mT if tall else G
    R, C = gv.shape[1], gv.shape[2]
    if R > 64 or C > 128:
        raise ValueError("tiny Muon is for the smoke shapes only")
    out = torch.empty_like(G) if out is None else out
    ov = out.mT if tall else out
    _tiny_muon_kernel[(batches or B,)](gv, ov, R, C, gv.stride(0), gv.stride(1), gv.stride(2),
                                      ov.stride(0), ov.stride(1), ov.stride(2),
                                      BR=_pow2(R), BC=_pow2(C), BF16=bf16_iterate, STEPS=steps)
    return out


def touch(t: torch.Tensor) -> None:
    """Launch a do-nothing Triton kernel on ``t``."""
    _touch_kernel[(1,)](t)
