"""Straightforward Triton port: Liger-Kernel's chunked fused linear cross-entropy, in Triton.

A competent direct translation of the popular library design: the tokens are cut into chunks
of ``BT / ceil(V / H)`` rows (rounded to a power of two; the transient logits then stay about
the size of x), and per chunk (1) a tiled Triton matmul writes the chunk's logits in float32,
(2) a cross-entropy kernel (one program per row) takes the max and the sum of exponentials in
one online pass, writes the row's loss and, in a second pass, the row's softmax gradient
``(softmax - onehot) / N`` in the input dtype, (3) the same matmul computes ``dX_chunk = P W``
and (4) accumulates ``dW += P^T x_chunk`` in float32. N is counted on the device. Shapes as in
``reference.run``.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


@triton.jit
def _mm_kernel(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
               ACCUMULATE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
               GROUP_M: tl.constexpr):
    """C = A @ B (ACCUMULATE: C += A @ B), float32 accumulation; grouped tile order."""
    pid = tl.program_id(0)
    n_m = tl.cdiv(M, BM)
    n_n = tl.cdiv(N, BN)
    per_group = GROUP_M * n_n
    first = (pid // per_group) * GROUP_M
    size = tl.minimum(n_m - first, GROUP_M)
    pid_m = first + (pid % per_group) % size
    pid_n = (pid % per_group) // size
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(A + rm[:, None].to(tl.int64) * stride_am + (k + rk)[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & (k + rk[None, :] < K), other=0.0)
        b = tl.load(B + (k + rk)[:, None].to(tl.int64) * stride_bk + rn[None, :] * stride_bn,
                    mask=(k + rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    cptr = C + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn
    cmask = (rm[:, None] < M) & (rn[None, :] < N)
    if ACCUMULATE:
        acc += tl.load(cptr, mask=cmask, other=0.0)
    tl.store(cptr, acc.to(C.dtype.element_ty), mask=cmask)


@triton.jit
def _count_kernel(LAB, NPTR, BT, ignore_index, BLOCK: tl.constexpr):
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for t0 in range(0, BT, BLOCK):
        t = t0 + tl.arange(0, BLOCK)
        acc += (tl.load(LAB + t, mask=t < BT, other=ignore_index) != ignore_index).to(tl.int32)
    tl.store(NPTR, tl.maximum(tl.sum(acc, axis=0), 1).to(tl.float32))


@triton.jit
def _ce_row_kernel(S, G, LAB, LOSS, NPTR, V, stride_s, stride_g, ignore_index, BLOCK: tl.constexpr):
    """Grid (rows,): online max / sum of exp over the row's logits, the row's loss, then the
    softmax gradient (softmax - onehot) / N into G (0 for an ignored row)."""
    r = tl.program_id(0)
    lab = tl.load(LAB + r)
    valid = lab != ignore_index
    srow = S + r.to(tl.int64) * stride_s
    m = tl.full((BLOCK,), float("-inf"), tl.float32)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for c0 in range(0, V, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        s = tl.load(srow + cols, mask=cols < V, other=float("-inf"))
        m_new = tl.maximum(m, s)
        acc = acc * tl.exp(tl.where(m_new == float("-inf"), 0.0, m - m_new)) + tl.where(s == float("-inf"), 0.0, tl.exp(s - m_new))
        m = m_new
    mx = tl.max(m, axis=0)
    lse = mx + tl.log(tl.sum(acc * tl.exp(m - mx), axis=0))
    tgt = tl.load(srow + tl.where(valid, lab, 0))
    tl.store(LOSS + r, tl.where(valid, lse - tgt, 0.0))
    scale = tl.where(valid, 1.0 / tl.load(NPTR), 0.0)
    grow = G + r.to(tl.int64) * stride_g
    for c0 in range(0, V, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        s = tl.load(srow + cols, mask=cols < V, other=0.0)
        p = (tl.exp(s - lse) - tl.where(cols == lab, 1.0, 0.0)) * scale
        tl.store(grow + cols, p.to(G.dtype.element_ty), mask=cols < V)


@triton.jit
def _sum_kernel(LOSS, NPTR, OUT, BT, BLOCK: tl.constexpr):
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for t0 in range(0, BT, BLOCK):
        t = t0 + tl.arange(0, BLOCK)
        acc += tl.load(LOSS + t, mask=t < BT, other=0.0)
    tl.store(OUT, tl.sum(acc, axis=0) / tl.load(NPTR))


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _mm(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, accumulate: bool = False) -> None:
    """c (+)= a @ b for 2-D views of any strides (the tutorial's tiles: 128 x 128 x 32, 4 warps)."""
    M, K = a.shape
    N = b.shape[1]
    bm, bn, bk, warps, stages = (32, 32, 32, 4, 1) if _interpreting() else (128, 128, 32, 4, 3)
    _mm_kernel[(triton.cdiv(M, bm) * triton.cdiv(N, bn),)](
        a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        ACCUMULATE=accumulate, BM=bm, BN=bn, BK=bk, GROUP_M=8, num_warps=warps, num_stages=stages)


def run(x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, ignore_index: int):
    """Chunked loss and gradients; returns ``(loss [] float32, dX [BT, H], dW [V, H] float32)``."""
    BT, H = x.shape
    V = weight.shape[0]
    dev = x.device
    chunk = min(triton.next_power_of_2(triton.cdiv(BT, triton.cdiv(V, H))), BT)
    if _interpreting():   # the CPU interpreter: chunks of at least 32 rows (test time), still several
        chunk = min(max(chunk, 32), BT)
    dx = torch.empty((BT, H), dtype=x.dtype, device=dev)
    dw = torch.empty((V, H), dtype=torch.float32, device=dev)
    loss = torch.empty((), dtype=torch.float32, device=dev)
    logits = torch.empty((chunk, V), dtype=torch.float32, device=dev)
    grad = torch.empty((chunk, V), dtype=x.dtype, device=dev)
    row_loss = torch.empty((BT,), dtype=torch.float32, device=dev)
    n = torch.empty((1,), dtype=torch.float32, device=dev)
    _count_kernel[(1,)](labels, n, BT, ignore_index, BLOCK=1024)
    for r0 in range(0, BT, chunk):
        rows = min(chunk, BT - r0)
        xc, s, g = x[r0:r0 + rows], logits[:rows], grad[:rows]
        _mm(xc, weight.t(), s)
        _ce_row_kernel[(rows,)](s, g, labels[r0:], row_loss[r0:], n, V, s.stride(0), g.stride(0), ignore_index,
                                BLOCK=1024, num_warps=4)
        _mm(g, weight, dx[r0:r0 + rows])
        _mm(g.t(), xc, dw, accumulate=r0 > 0)
    _sum_kernel[(1,)](row_loss, n, loss, BT, BLOCK=1024)
    return loss, dx, dw
