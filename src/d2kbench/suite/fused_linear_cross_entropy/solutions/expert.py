"""Expert Triton solution: fused linear cross-entropy, forward and backward, logits never whole.

Contract (identical to ``reference.run``)
------------------------------------------
``run(x, weight, labels, ignore_index)`` with ``x [BT, H]`` bf16, ``weight [V, H]`` bf16,
``labels [BT]`` int64 (``ignore_index`` = not counted). Returns ``(loss [] float32, dX [BT, H]
bf16, dW [V, H] float32)``: the mean cross-entropy over the N valid tokens and its gradients.

Design
------
L1 -- three products, the logits only one chunk at a time. The tokens are processed in chunks
    of C rows (C a power of two, the chunk's workspace <= 768 MiB: 2048 rows at these
    vocabularies). Per chunk the logits product ``s = x_c W^T`` runs with an epilogue that
    never leaves the tile: per (row, 256-column vocab tile) it takes the tile max m, stores
    ``e = exp(s - m)`` in bf16 and the partial (m, sum e), and the program whose tile holds a
    row's label keeps that logit. A row pass merges the partials into the log-sum-exp (online
    softmax across tiles), writes the row's loss, and turns e into the gradient in place:
    ``P = e * exp(m - lse) / N - onehot / N`` (0 on ignored rows). Then ``dX_c = P W`` (the
    whole vocabulary is the reduction: complete per chunk, bf16) and ``dW += P^T x_c`` (float32,
    the output itself is the accumulator). 6 BT H V FLOPs in all (no recomputed logits), and
    the gradient of the logits is formed once, in place, and fed straight to both products.
    Storing e relative to its tile max makes the bf16 buffer as precise as the bf16 P the
    tensor cores need (relative 2^-9), unlike storing bf16 logits (absolute error |s| 2^-9).

L2 -- where values live. Per chunk: the bf16 e/P buffer ``[C, V]``, the partials ``[C, V/256]``
    (float32 m and sum), the label logits ``[C]``; the per-row losses ``[BT]`` and N (counted on
    the device, no host synchronisation). The logits product walks the grid vocab-major: the
    programs that run together share one 256-row slab of W (read from HBM once per chunk) and
    the chunk's x (16 MB, L2-resident). dX's reduction runs over V inside one program (no
    atomics); dW's over the chunk's rows, with the previous chunks' sum loaded as the initial
    accumulator (the float32 dW is read and written once per chunk).

L3 -- sm_90 products. 128 x 256 x 64 tiles (128 x 128 for dW, whose float32 read-add-write
    epilogue needs the registers), 8 warps (two warpgroups of wgmma), 3 stages of TMA loads (tensor descriptors; zero fill past the chunk's rows and the vocabulary), bf16
    operands and float32 accumulators; W is consumed K-major (``tl.trans`` of its [256, 64] tile)
    in the logits product and as stored in dX; P^T for dW is the transposed [64, 128] tile of
    P; the logits epilogue stores the bf16 e tile through a TMA store (clipped at the chunk's
    rows and the vocabulary). Grouped (GROUP_M) tile order in dX and dW for L2 reuse. exp2 with log2(e)-scaled
    differences in the epilogue. Pointer loads with masks under the interpreter (CPU) and for
    shapes TMA cannot describe.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

LOG2E = 1.4426950408889634
#: Workspace bound of the chunk's e/P buffer (bytes); the other per-chunk buffers are ~1% of it.
CHUNK_BYTES = 768 << 20


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _tile_a(desc, ptr, r, k, R, K, stride_r, BR: tl.constexpr, BK: tl.constexpr, USE_TMA: tl.constexpr):
    """Tile [BR, BK] of a row-major matrix [R, K] at (r, k) (zeros outside)."""
    if USE_TMA:
        return desc.load([r, k])
    rows = r + tl.arange(0, BR)
    cols = k + tl.arange(0, BK)
    m = (rows[:, None] < R) & (cols[None, :] < K)
    return tl.load(ptr + rows[:, None].to(tl.int64) * stride_r + cols[None, :], mask=m, other=0.0)


@triton.jit
def _logits_kernel(
    x_desc, w_desc, e_desc, X, W, LAB, E, MX, SM, SY,
    rows, V, H, NT,
    stride_x, stride_w, stride_e,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_V: tl.constexpr, USE_TMA: tl.constexpr,
):
    """One [BM rows, BN vocab] tile of the chunk's logits; grid vocab-major (cdiv(V, BN) x
    cdiv(rows, BM)). Writes e = exp(s - m) (E's dtype), the partials m and sum(e), and the
    logit of the label when the tile holds it."""
    pid = tl.program_id(0)
    n_m = tl.cdiv(rows, BM)
    pid_v = pid // n_m
    pid_m = pid % n_m
    m0 = pid_m * BM
    v0 = pid_v * BN
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, H, BK):
        a = _tile_a(x_desc, X, m0, k, rows, H, stride_x, BM, BK, USE_TMA)
        b = _tile_a(w_desc, W, v0, k, V, H, stride_w, BN, BK, USE_TMA)
        acc = tl.dot(a, tl.trans(b), acc)
    lr = m0 + tl.arange(0, BM)
    cols = v0 + tl.arange(0, BN)
    rmask = lr < rows
    # the label's logit first (the epilogue then rewrites acc in place: fewer live registers)
    lab = tl.load(LAB + lr, mask=rmask, other=-1)
    hit = rmask & (lab >= v0) & (lab < v0 + BN)
    tgt = tl.sum(tl.where(cols[None, :] == lab[:, None], acc, 0.0), axis=1)
    tl.store(SY + lr, tgt, mask=hit)
    if not EVEN_V:
        acc = tl.where((cols < V)[None, :], acc, float("-inf"))
    mx = tl.max(acc, axis=1)
    e = tl.exp2((acc - mx[:, None]) * 1.4426950408889634)
    tl.store(MX + lr * NT + pid_v, mx, mask=rmask)
    tl.store(SM + lr * NT + pid_v, tl.sum(e, axis=1), mask=rmask)
    if USE_TMA:   # TMA store: clipped at the chunk's rows and the vocabulary, no pointer tensor
        e_desc.store([m0, v0], e.to(E.dtype.element_ty))
    else:
        tl.store(E + lr[:, None].to(tl.int64) * stride_e + cols[None, :], e.to(E.dtype.element_ty),
                 mask=rmask[:, None] & (cols < V)[None, :])


@triton.jit
def _count_kernel(LAB, NPTR, BT, ignore_index, BLOCK: tl.constexpr):
    """N = number of valid labels (one program)."""
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for t0 in range(0, BT, BLOCK):
        t = t0 + tl.arange(0, BLOCK)
        lab = tl.load(LAB + t, mask=t < BT, other=ignore_index)
        acc += (lab != ignore_index).to(tl.int32)
    tl.store(NPTR, tl.maximum(tl.sum(acc, axis=0), 1).to(tl.float32))


@triton.jit
def _grad_row_kernel(
    E, MX, SM, SY, LAB, LOSS, NPTR,
    r0, V, NT, ignore_index, stride_e,
    TILE_V: tl.constexpr, NT_P: tl.constexpr, BLOCK: tl.constexpr,
):
    """Grid (rows of the chunk,): merge the row's tile partials into its log-sum-exp, write its
    loss, and turn its e row into P in place."""
    r = tl.program_id(0)
    lab = tl.load(LAB + r0 + r)
    valid = lab != ignore_index
    n = tl.load(NPTR)
    j = tl.arange(0, NT_P)
    m = tl.load(MX + r * NT + j, mask=j < NT, other=float("-inf"))
    s = tl.load(SM + r * NT + j, mask=j < NT, other=0.0)
    mx = tl.max(m, axis=0)
    lse = mx + tl.log(tl.sum(s * tl.exp(m - mx), axis=0))
    sy = tl.load(SY + r, mask=valid, other=0.0)
    tl.store(LOSS + r0 + r, tl.where(valid, lse - sy, 0.0))
    scale = tl.where(valid, 1.0 / n, 0.0)
    row = E + r.to(tl.int64) * stride_e
    for c0 in range(0, V, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        cm = cols < V
        e = tl.load(row + cols, mask=cm, other=0.0).to(tl.float32)
        mj = tl.load(MX + r * NT + cols // TILE_V, mask=cm, other=0.0)
        p = e * (tl.exp(mj - lse) * scale) - tl.where(cols == lab, scale, 0.0)
        tl.store(row + cols, p.to(E.dtype.element_ty), mask=cm)


@triton.jit
def _loss_kernel(LOSS, NPTR, OUT, BT, BLOCK: tl.constexpr):
    """loss = sum of the per-row losses / N (one program, fixed order)."""
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for t0 in range(0, BT, BLOCK):
        t = t0 + tl.arange(0, BLOCK)
        acc += tl.load(LOSS + t, mask=t < BT, other=0.0)
    tl.store(OUT, tl.sum(acc, axis=0) / tl.load(NPTR))


@triton.jit
def _grouped(pid, n_m, n_n, GROUP_M: tl.constexpr):
    """Grouped tile order: GROUP_M row panels share each column panel consecutively."""
    per_group = GROUP_M * n_n
    first = (pid // per_group) * GROUP_M
    size = tl.minimum(n_m - first, GROUP_M)
    return first + (pid % per_group) % size, (pid % per_group) // size


@triton.jit
def _dx_kernel(
    p_desc, w_desc, P, W, DX,
    rows, V, H,
    stride_p, stride_w, stride_dx,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, USE_TMA: tl.constexpr,
):
    """dX[i] = sum_v P[i, v] W[v, :] for the chunk's rows (DX: the chunk's rows of dX); grid
    cdiv(rows, BM) x cdiv(H, BN)."""
    pid_m, pid_n = _grouped(tl.program_id(0), tl.cdiv(rows, BM), tl.cdiv(H, BN), GROUP_M)
    m0 = pid_m * BM
    n0 = pid_n * BN
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, V, BK):
        a = _tile_a(p_desc, P, m0, k, rows, V, stride_p, BM, BK, USE_TMA)
        b = _tile_a(w_desc, W, k, n0, V, H, stride_w, BK, BN, USE_TMA)
        acc = tl.dot(a, b, acc)
    lr = m0 + tl.arange(0, BM)
    cols = n0 + tl.arange(0, BN)
    tl.store(DX + lr[:, None].to(tl.int64) * stride_dx + cols[None, :], acc.to(DX.dtype.element_ty),
             mask=(lr[:, None] < rows) & (cols[None, :] < H))


@triton.jit
def _dw_kernel(
    p_desc, x_desc, P, X, DW,
    rows, V, H,
    stride_p, stride_x, stride_dw,
    FIRST: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    USE_TMA: tl.constexpr,
):
    """dW[v, :] (+)= sum_i P[i, v] X[i, :] (X: the chunk's rows of x); grid cdiv(V, BM) x cdiv(H, BN). The previous
    chunks' float32 sum is the initial accumulator (FIRST: zero)."""
    pid_m, pid_n = _grouped(tl.program_id(0), tl.cdiv(V, BM), tl.cdiv(H, BN), GROUP_M)
    v0 = pid_m * BM
    n0 = pid_n * BN
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, rows, BK):
        a = _tile_a(p_desc, P, k, v0, rows, V, stride_p, BK, BM, USE_TMA)       # [BK rows, BM vocab]
        b = _tile_a(x_desc, X, k, n0, rows, H, stride_x, BK, BN, USE_TMA)
        acc = tl.dot(tl.trans(a), b, acc)
    # the previous chunks' sum is added after the loop, so it is not live during it
    vr = v0 + tl.arange(0, BM)
    cols = n0 + tl.arange(0, BN)
    omask = (vr[:, None] < V) & (cols[None, :] < H)
    optr = DW + vr[:, None].to(tl.int64) * stride_dw + cols[None, :]
    if not FIRST:
        acc += tl.load(optr, mask=omask, other=0.0)
    tl.store(optr, acc, mask=omask)


def _config() -> dict:
    if _interpreting():
        return {"BM": 32, "BN": 32, "BK": 32, "TILE_V": 32, "BN_DW": 32, "warps": 4, "stages": 1, "group": 2}
    # dW: 128 x 128 output tiles (its float32 read-add-write epilogue on a 128 x 256 tile spills)
    return {"BM": 128, "BN": 256, "BK": 64, "TILE_V": 256, "BN_DW": 128, "warps": 8, "stages": 3, "group": 8}


def chunk_rows(BT: int, V: int, elem: int = 2, budget: int = CHUNK_BYTES) -> int:
    """Rows per chunk: the largest power of two whose e/P buffer fits ``budget`` (at least 128),
    capped at BT rounded up to 128."""
    c = 128
    while c * 2 * V * elem <= budget:
        c *= 2
    return min(c, triton.cdiv(BT, 128) * 128)


def _tma_ok(*ts: torch.Tensor) -> bool:
    return (not _interpreting()) and all(
        t.stride(-1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0
        for t in ts)


def run(x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, ignore_index: int):
    """Loss and gradients (see the module docstring).

    Raises:
        ValueError: x and weight of different hidden sizes or dtypes, or non-contiguous rows.
    """
    BT, H = x.shape
    V = weight.shape[0]
    if weight.shape[1] != H or weight.dtype != x.dtype or x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("x [BT, H] and weight [V, H] must share H and dtype, with contiguous rows")
    dev = x.device
    cfg = _config()
    BM, BN, BK, TV = cfg["BM"], cfg["BN"], cfg["BK"], cfg["TILE_V"]
    dx = torch.empty((BT, H), dtype=x.dtype, device=dev)
    dw = torch.empty((V, H), dtype=torch.float32, device=dev)
    loss = torch.empty((), dtype=torch.float32, device=dev)
    # the interpreter runs several small chunks, so that the CPU checks cover the chunk loop
    C = cfg["BM"] if _interpreting() else chunk_rows(BT, V, x.element_size())
    NT = triton.cdiv(V, TV)
    work = torch.empty((C, V), dtype=x.dtype, device=dev)
    mx = torch.empty((C, NT), dtype=torch.float32, device=dev)
    sm = torch.empty((C, NT), dtype=torch.float32, device=dev)
    sy = torch.empty((C,), dtype=torch.float32, device=dev)
    row_loss = torch.empty((BT,), dtype=torch.float32, device=dev)
    n = torch.empty((1,), dtype=torch.float32, device=dev)
    _count_kernel[(1,)](labels, n, BT, ignore_index, BLOCK=1024, num_warps=4)
    tma = _tma_ok(x, weight, work)
    w_rows = TensorDescriptor.from_tensor(weight, [TV, BK]) if tma else None     # logits: [256 vocab, 64 k]
    w_kn = TensorDescriptor.from_tensor(weight, [BK, BN]) if tma else None       # dX: [64 vocab, 256 h]
    for r0 in range(0, BT, C):
        rows = min(C, BT - r0)
        xc = x[r0:r0 + rows]
        pc = work[:rows]
        if tma:
            x_mk = TensorDescriptor.from_tensor(xc, [BM, BK])
            x_kn = TensorDescriptor.from_tensor(xc, [BK, cfg["BN_DW"]])
            e_mn = TensorDescriptor.from_tensor(pc, [BM, TV])
            p_mk = TensorDescriptor.from_tensor(pc, [BM, BK])
            p_km = TensorDescriptor.from_tensor(pc, [BK, BM])
        else:
            x_mk = x_kn = p_mk = p_km = e_mn = None
        _logits_kernel[(NT * triton.cdiv(rows, BM),)](
            x_mk, w_rows, e_mn, xc, weight, labels[r0:], work, mx, sm, sy,
            rows, V, H, NT, x.stride(0), weight.stride(0), work.stride(0),
            BM=BM, BN=TV, BK=BK, EVEN_V=V % TV == 0, USE_TMA=tma, num_warps=cfg["warps"], num_stages=cfg["stages"])
        _grad_row_kernel[(rows,)](
            work, mx, sm, sy, labels, row_loss, n, r0, V, NT, ignore_index, work.stride(0),
            TILE_V=TV, NT_P=triton.next_power_of_2(NT), BLOCK=2048, num_warps=8)
        _dx_kernel[(triton.cdiv(rows, BM) * triton.cdiv(H, BN),)](
            p_mk, w_kn, work, weight, dx[r0:], rows, V, H, work.stride(0), weight.stride(0), dx.stride(0),
            BM=BM, BN=BN, BK=BK, GROUP_M=cfg["group"], USE_TMA=tma, num_warps=cfg["warps"], num_stages=cfg["stages"])
        _dw_kernel[(triton.cdiv(V, BM) * triton.cdiv(H, cfg["BN_DW"]),)](
            p_km, x_kn, work, xc, dw, rows, V, H, work.stride(0), x.stride(0), dw.stride(0),
            FIRST=r0 == 0, BM=BM, BN=cfg["BN_DW"], BK=BK, GROUP_M=cfg["group"], USE_TMA=tma,
            num_warps=cfg["warps"], num_stages=cfg["stages"])
    _loss_kernel[(1,)](row_loss, n, loss, BT, BLOCK=1024, num_warps=4)
    return loss, dx, dw
