"""Expert Triton solution: Gated DeltaNet prefill in the chunked (WY / UT) form.

Contract (identical to ``reference.run``)
------------------------------------------
``run(q, k, v, g, beta, cu_seqlens, state_pool, state_indices, has_initial_state, scale)`` with
``q``/``k [T, HK, K]``, ``v [T, HV, V]``, ``beta [T, HV]`` (bf16; fp16 on CPU smoke workloads),
``g [T, HV]`` float32 log decays, ``cu_seqlens [N + 1]`` int32, ``state_pool [NS, HV, K, V]``
float32 (read at the slots of sequences with an initial state, overwritten in place at every
slot in ``state_indices`` with the final state); returns ``o [T, HV, V]`` in v's dtype.

Design
------
L1 -- chunks of 64 tokens; only the chunk-to-chunk step is sequential.
    Inside a chunk, with ``G`` the inclusive cumulative gate and ``Gam_ij = exp(G_i - G_j)``, the
    64 rank-one delta-rule updates are one unit-lower-triangular system:
    ``A = I + strict_lower(diag(beta) (K^ K^T o Gam))``, ``X = A^-1``, ``W = X diag(beta) (K^ o e^G)``,
    ``U = X diag(beta) V``. Given the chunk-entry state ``S``, the corrected values are
    ``V' = U - W S``, the output ``O = scale [(Q^ o e^G) S + (Q^ K^T o Gam o causal) V']`` and the
    next state ``e^{G_last} S + (K^ o e^{G_last - G})^T V'``. T serial rank-one updates become
    T / 64 serial steps of two small tensor-core products; everything else is parallel.
    ``X`` is computed blockwise: the four 16 x 16 diagonal blocks are inverted as nilpotent
    matrices, ``(I + N)^-1 = (I - N)(I + N^2)(I + N^4)(I + N^8)`` (six 16^3 products, no serial
    row loop), the six off-diagonal blocks follow from block forward substitution.
    GVA: the value heads of a key head share ``Q^ K^T``; the output pass computes it once per key
    head (``K^ K^T`` is shared too, but the W/U pass runs per value head: keeping the ten 16 x 16
    Gram blocks live across two heads' inverses exceeds the register file). The q/k L2 norm and the in-chunk gate cumsum (pre-scaled by log2 e so
    every decay is one exp2) are fused into the kernels that read q, k and g; no normalised
    copy is written.

L2 -- three launches.
    1. ``_wy_kernel`` (chunk, value head): normalise the chunk's keys, the ten gated 16 x 16
       blocks of the system, their inverse in registers (fp32 products), and W, U (bf16,
       [T, HV, *]) plus the cumulative gate (fp32).
    2. ``_state_kernel`` (sequence, value head, V block): the state tile (K x BV, fp32) lives in
       registers for the whole sequence, starting straight from the pool slot (or zero: the
       NaN slot is never loaded); per chunk it stores the entry state (bf16) for the output
       kernel, forms V' = U - W S (stored bf16), decays and updates S; at the end S goes back
       to the slot. The loads of a chunk do not depend on S, so they are prefetched.
    3. ``_output_kernel`` (chunk, key head): ``Q^ K^T`` once, then per value head the gated causal
       product with V' and the inter-chunk term ``(Q^ o e^G) S_c``, 32 value columns at a time.
    Varlen: chunks never span sequences; chunk programs find their (sequence, chunk) from
    ``cu_seqlens`` on the device (a prefix sum of the per-sequence chunk counts), the grid is the
    upper bound ``T / 64 + N`` chunks and surplus programs exit. No host reads: graph-safe.

L3 -- execution.
    The state kernel is the serial critical path: BV = 32 when sequences x heads are few (more
    programs on the SMs), 64 otherwise; its per-chunk work is two dependent MMAs and an
    elementwise decay, with the next chunk's W, U, K and gates loaded ahead by the software
    pipeline. The inverse uses fp32 (IEEE) products; every other product takes bf16 operands
    with fp32 accumulation. Gate differences are masked before exp2 (upper-triangle
    differences are positive and could overflow). Register budget (sm_90, no spills): the W/U
    pass reloads the key rows for W instead of keeping them live across the inverse, and it
    and the output pass run 8 warps; the state pass 4 warps with 2 pipeline stages.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: Chunk length and the inverse's diagonal block.
BT = 64
BC = 16
LOG2E = 1.4426950408889634
EPS = 1e-6
#: SMs of the target GPU (H200); only the state kernel's V split reads it.
SMS = 132


@triton.jit
def _chunk_of(pid, cu_ptr, N, BT: tl.constexpr, NP: tl.constexpr):
    """(sequence, chunk within it, bos, eos) of global chunk ``pid``; sequence == N when ``pid``
    is past the last chunk. Chunks are numbered sequence by sequence."""
    i = tl.arange(0, NP)
    starts = tl.load(cu_ptr + i, mask=i < N, other=0)
    ends = tl.load(cu_ptr + i + 1, mask=i < N, other=0)
    nch = (ends - starts + BT - 1) // BT
    incl = tl.cumsum(nch, 0)
    seq = tl.sum((incl <= pid).to(tl.int32), 0)
    first = tl.sum(tl.where(i == seq, incl - nch, 0), 0)
    bos = tl.sum(tl.where(i == seq, starts, 0), 0)
    eos = tl.sum(tl.where(i == seq, ends, 0), 0)
    return seq, pid - first, bos, eos


@triton.jit
def _load_rows(ptr, t0, r, eos, stride_t, D: tl.constexpr):
    """Rows ``t0 + r`` (masked at ``eos``) of a [T, *, D] tensor at ``ptr``, zeros outside."""
    cols = tl.arange(0, D)
    t = t0 + r
    return tl.load(ptr + t.to(tl.int64)[:, None] * stride_t + cols[None, :], mask=(t < eos)[:, None], other=0.0)


@triton.jit
def _l2n(x):
    x = x.to(tl.float32)
    return x * tl.rsqrt(tl.sum(x * x, 1) + 1e-6)[:, None]


@triton.jit
def _inv_diag(N_, eye):
    """(I + N)^-1 for a strictly lower-triangular 16 x 16 block N (N^16 = 0)."""
    n2 = tl.dot(N_, N_, input_precision="ieee")
    n4 = tl.dot(n2, n2, input_precision="ieee")
    n8 = tl.dot(n4, n4, input_precision="ieee")
    x = eye - N_
    x = x + tl.dot(x, n2, input_precision="ieee")
    x = x + tl.dot(x, n4, input_precision="ieee")
    x = x + tl.dot(x, n8, input_precision="ieee")
    return x


@triton.jit
def _wy_kernel(k_ptr, v_ptr, g_ptr, beta_ptr, cu_ptr, w_ptr, u_ptr, gc_ptr, N,
               s_kt, s_vt, s_wt, s_ut,
               HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
               BT: tl.constexpr, BC: tl.constexpr, NP: tl.constexpr):
    pid = tl.program_id(0)
    h = tl.program_id(1)
    seq, c, bos, eos = _chunk_of(pid, cu_ptr, N, BT, NP)
    if seq >= N:
        return
    hk = h // GROUP
    t0 = bos + c * BT
    r = tl.arange(0, BC)
    dt = k_ptr.dtype.element_ty
    t_0 = t0 + r
    t_1 = t_0 + BC
    t_2 = t_1 + BC
    t_3 = t_2 + BC
    # in-chunk inclusive cumulative gate, in log2 units (every decay below is one exp2)
    g0 = tl.load(g_ptr + t_0.to(tl.int64) * HV + h, mask=t_0 < eos, other=0.0) * 1.4426950408889634
    g1 = tl.load(g_ptr + t_1.to(tl.int64) * HV + h, mask=t_1 < eos, other=0.0) * 1.4426950408889634
    g2 = tl.load(g_ptr + t_2.to(tl.int64) * HV + h, mask=t_2 < eos, other=0.0) * 1.4426950408889634
    g3 = tl.load(g_ptr + t_3.to(tl.int64) * HV + h, mask=t_3 < eos, other=0.0) * 1.4426950408889634
    G0 = tl.cumsum(g0, 0)
    G1 = tl.cumsum(g1, 0) + tl.sum(g0, 0)
    G2 = tl.cumsum(g2, 0) + tl.sum(g0, 0) + tl.sum(g1, 0)
    G3 = tl.cumsum(g3, 0) + tl.sum(g0, 0) + tl.sum(g1, 0) + tl.sum(g2, 0)
    tl.store(gc_ptr + t_0.to(tl.int64) * HV + h, G0, mask=t_0 < eos)
    tl.store(gc_ptr + t_1.to(tl.int64) * HV + h, G1, mask=t_1 < eos)
    tl.store(gc_ptr + t_2.to(tl.int64) * HV + h, G2, mask=t_2 < eos)
    tl.store(gc_ptr + t_3.to(tl.int64) * HV + h, G3, mask=t_3 < eos)
    b0 = tl.load(beta_ptr + t_0.to(tl.int64) * HV + h, mask=t_0 < eos, other=0.0).to(tl.float32)
    b1 = tl.load(beta_ptr + t_1.to(tl.int64) * HV + h, mask=t_1 < eos, other=0.0).to(tl.float32)
    b2 = tl.load(beta_ptr + t_2.to(tl.int64) * HV + h, mask=t_2 < eos, other=0.0).to(tl.float32)
    b3 = tl.load(beta_ptr + t_3.to(tl.int64) * HV + h, mask=t_3 < eos, other=0.0).to(tl.float32)
    kp = k_ptr + hk * K
    k0 = _l2n(_load_rows(kp, t0, r, eos, s_kt, K)).to(dt)
    k1 = _l2n(_load_rows(kp, t0 + BC, r, eos, s_kt, K)).to(dt)
    k2 = _l2n(_load_rows(kp, t0 + 2 * BC, r, eos, s_kt, K)).to(dt)
    k3 = _l2n(_load_rows(kp, t0 + 3 * BC, r, eos, s_kt, K)).to(dt)
    eye = (r[:, None] == r[None, :]).to(tl.float32)
    strict = r[:, None] > r[None, :]
    # N = A - I by 16 x 16 blocks: beta_i (k^_i . k^_j) 2^(G_i - G_j), strictly lower. On a diagonal
    # block G_i - G_j > 0 above the diagonal (masked before exp2: it could overflow); the blocks
    # below the diagonal have G_i <= G_j everywhere (padded rows repeat the last valid gate).
    # X = (I + N)^-1: diagonal blocks inverted as nilpotent matrices, then block forward
    # substitution; every product in fp32.
    n00 = tl.dot(k0, tl.trans(k0)) * b0[:, None] * tl.exp2(tl.where(strict, G0[:, None] - G0[None, :], float("-inf")))
    x00 = _inv_diag(n00, eye)
    n11 = tl.dot(k1, tl.trans(k1)) * b1[:, None] * tl.exp2(tl.where(strict, G1[:, None] - G1[None, :], float("-inf")))
    x11 = _inv_diag(n11, eye)
    n22 = tl.dot(k2, tl.trans(k2)) * b2[:, None] * tl.exp2(tl.where(strict, G2[:, None] - G2[None, :], float("-inf")))
    x22 = _inv_diag(n22, eye)
    n33 = tl.dot(k3, tl.trans(k3)) * b3[:, None] * tl.exp2(tl.where(strict, G3[:, None] - G3[None, :], float("-inf")))
    x33 = _inv_diag(n33, eye)
    n10 = tl.dot(k1, tl.trans(k0)) * b1[:, None] * tl.exp2(G1[:, None] - G0[None, :])
    x10 = -tl.dot(x11, tl.dot(n10, x00, input_precision="ieee"), input_precision="ieee")
    n32 = tl.dot(k3, tl.trans(k2)) * b3[:, None] * tl.exp2(G3[:, None] - G2[None, :])
    x32 = -tl.dot(x33, tl.dot(n32, x22, input_precision="ieee"), input_precision="ieee")
    n20 = tl.dot(k2, tl.trans(k0)) * b2[:, None] * tl.exp2(G2[:, None] - G0[None, :])
    n21 = tl.dot(k2, tl.trans(k1)) * b2[:, None] * tl.exp2(G2[:, None] - G1[None, :])
    p20 = tl.dot(n20, x00, input_precision="ieee") + tl.dot(n21, x10, input_precision="ieee")
    q21 = tl.dot(n21, x11, input_precision="ieee")
    x20 = -tl.dot(x22, p20, input_precision="ieee")
    x21 = -tl.dot(x22, q21, input_precision="ieee")
    n30 = tl.dot(k3, tl.trans(k0)) * b3[:, None] * tl.exp2(G3[:, None] - G0[None, :])
    n31 = tl.dot(k3, tl.trans(k1)) * b3[:, None] * tl.exp2(G3[:, None] - G1[None, :])
    r30 = tl.dot(n30, x00, input_precision="ieee") + tl.dot(n31, x10, input_precision="ieee")
    x30 = -(tl.dot(x32, p20, input_precision="ieee") + tl.dot(x33, r30, input_precision="ieee"))
    r31 = tl.dot(n31, x11, input_precision="ieee")
    x31 = -(tl.dot(x32, q21, input_precision="ieee") + tl.dot(x33, r31, input_precision="ieee"))
    # W = X (beta k^ e^G) and U = X (beta v), block row by block row, in the input dtype (the key
    # rows are loaded again, from L1/L2, rather than kept live across the inverse)
    cols_k = tl.arange(0, K)
    cols_v = tl.arange(0, V)
    wp = w_ptr + h * K
    up = u_ptr + h * V
    vp = v_ptr + h * V
    kb0 = (_l2n(_load_rows(kp, t0, r, eos, s_kt, K)) * (b0 * tl.exp2(G0))[:, None]).to(dt)
    vb0 = (_load_rows(vp, t0, r, eos, s_vt, V).to(tl.float32) * b0[:, None]).to(dt)
    tl.store(wp + t_0.to(tl.int64)[:, None] * s_wt + cols_k[None, :],
             tl.dot(x00.to(dt), kb0).to(dt), mask=(t_0 < eos)[:, None])
    tl.store(up + t_0.to(tl.int64)[:, None] * s_ut + cols_v[None, :],
             tl.dot(x00.to(dt), vb0).to(dt), mask=(t_0 < eos)[:, None])
    kb1 = (_l2n(_load_rows(kp, t0 + BC, r, eos, s_kt, K)) * (b1 * tl.exp2(G1))[:, None]).to(dt)
    vb1 = (_load_rows(vp, t0 + BC, r, eos, s_vt, V).to(tl.float32) * b1[:, None]).to(dt)
    tl.store(wp + t_1.to(tl.int64)[:, None] * s_wt + cols_k[None, :],
             (tl.dot(x10.to(dt), kb0) + tl.dot(x11.to(dt), kb1)).to(dt), mask=(t_1 < eos)[:, None])
    tl.store(up + t_1.to(tl.int64)[:, None] * s_ut + cols_v[None, :],
             (tl.dot(x10.to(dt), vb0) + tl.dot(x11.to(dt), vb1)).to(dt), mask=(t_1 < eos)[:, None])
    kb2 = (_l2n(_load_rows(kp, t0 + 2 * BC, r, eos, s_kt, K)) * (b2 * tl.exp2(G2))[:, None]).to(dt)
    vb2 = (_load_rows(vp, t0 + 2 * BC, r, eos, s_vt, V).to(tl.float32) * b2[:, None]).to(dt)
    tl.store(wp + t_2.to(tl.int64)[:, None] * s_wt + cols_k[None, :],
             (tl.dot(x20.to(dt), kb0) + tl.dot(x21.to(dt), kb1) + tl.dot(x22.to(dt), kb2)).to(dt),
             mask=(t_2 < eos)[:, None])
    tl.store(up + t_2.to(tl.int64)[:, None] * s_ut + cols_v[None, :],
             (tl.dot(x20.to(dt), vb0) + tl.dot(x21.to(dt), vb1) + tl.dot(x22.to(dt), vb2)).to(dt),
             mask=(t_2 < eos)[:, None])
    kb3 = (_l2n(_load_rows(kp, t0 + 3 * BC, r, eos, s_kt, K)) * (b3 * tl.exp2(G3))[:, None]).to(dt)
    vb3 = (_load_rows(vp, t0 + 3 * BC, r, eos, s_vt, V).to(tl.float32) * b3[:, None]).to(dt)
    tl.store(wp + t_3.to(tl.int64)[:, None] * s_wt + cols_k[None, :],
             (tl.dot(x30.to(dt), kb0) + tl.dot(x31.to(dt), kb1) + tl.dot(x32.to(dt), kb2)
              + tl.dot(x33.to(dt), kb3)).to(dt), mask=(t_3 < eos)[:, None])
    tl.store(up + t_3.to(tl.int64)[:, None] * s_ut + cols_v[None, :],
             (tl.dot(x30.to(dt), vb0) + tl.dot(x31.to(dt), vb1) + tl.dot(x32.to(dt), vb2)
              + tl.dot(x33.to(dt), vb3)).to(dt), mask=(t_3 < eos)[:, None])


@triton.jit
def _state_kernel(k_ptr, w_ptr, u_ptr, gc_ptr, cu_ptr, pool_ptr, idx_ptr, init_ptr, vn_ptr, hs_ptr, N,
                  s_kt, s_wt, s_ut, s_ps, s_ph,
                  HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BT: tl.constexpr, BV: tl.constexpr, NP: tl.constexpr):
    iv = tl.program_id(0)
    pid = tl.program_id(1)
    seq = pid // HV
    h = pid % HV
    hk = h // GROUP
    dt = k_ptr.dtype.element_ty
    i = tl.arange(0, NP)
    starts = tl.load(cu_ptr + i, mask=i < N, other=0)
    ends = tl.load(cu_ptr + i + 1, mask=i < N, other=0)
    nch = (ends - starts + BT - 1) // BT
    first = tl.sum(tl.where(i < seq, nch, 0), 0)
    bos = tl.load(cu_ptr + seq)
    eos = tl.load(cu_ptr + seq + 1)
    slot = tl.load(idx_ptr + seq).to(tl.int64)
    has = tl.load(init_ptr + seq) != 0
    rk = tl.arange(0, K)
    cv = iv * BV + tl.arange(0, BV)
    rt = tl.arange(0, BT)
    sp = pool_ptr + slot * s_ps + h * s_ph + rk[:, None] * V + cv[None, :]
    S = tl.load(sp, mask=has & (rk[:, None] >= 0), other=0.0)          # never reads a NaN slot
    n = (eos - bos + BT - 1) // BT
    for c in range(n):
        t = bos + c * BT + rt
        m = t < eos
        t64 = t.to(tl.int64)
        hp = hs_ptr + ((first + c).to(tl.int64) * HV + h) * (K * V) + rk[:, None] * V + cv[None, :]
        tl.store(hp, S.to(dt))
        w = tl.load(w_ptr + t64[:, None] * s_wt + h * K + rk[None, :], mask=m[:, None], other=0.0)
        u = tl.load(u_ptr + t64[:, None] * s_ut + h * V + cv[None, :], mask=m[:, None], other=0.0)
        kk = tl.load(k_ptr + t64[:, None] * s_kt + hk * K + rk[None, :], mask=m[:, None], other=0.0)
        G = tl.load(gc_ptr + t64 * HV + h, mask=m, other=0.0)
        g_last = tl.load(gc_ptr + (tl.minimum(bos + c * BT + BT, eos) - 1).to(tl.int64) * HV + h)
        vn = u.to(tl.float32) - tl.dot(w, S.to(dt))
        tl.store(vn_ptr + t64[:, None] * s_ut + h * V + cv[None, :], vn.to(dt), mask=m[:, None])
        kd = (_l2n(kk) * tl.exp2(tl.where(m, g_last - G, float("-inf")))[:, None]).to(dt)
        S = S * tl.exp2(g_last) + tl.dot(tl.trans(kd), vn.to(dt))
    tl.store(sp, S)


@triton.jit
def _output_kernel(q_ptr, k_ptr, vn_ptr, gc_ptr, hs_ptr, cu_ptr, o_ptr, N, scale,
                   s_qt, s_kt, s_vt, s_ot,
                   HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                   BT: tl.constexpr, BV: tl.constexpr, NP: tl.constexpr):
    pid = tl.program_id(0)
    hk = tl.program_id(1)
    seq, c, bos, eos = _chunk_of(pid, cu_ptr, N, BT, NP)
    if seq >= N:
        return
    t0 = bos + c * BT
    rt = tl.arange(0, BT)
    t = t0 + rt
    m = t < eos
    t64 = t.to(tl.int64)
    dt = q_ptr.dtype.element_ty
    rk = tl.arange(0, K)
    qb = _l2n(_load_rows(q_ptr + hk * K, t0, rt, eos, s_qt, K)).to(dt)
    kb = _l2n(_load_rows(k_ptr + hk * K, t0, rt, eos, s_kt, K)).to(dt)
    qk = tl.dot(qb, tl.trans(kb))                                       # shared by the GROUP value heads
    causal = (rt[:, None] >= rt[None, :]) & m[:, None]
    for j in range(GROUP):
        h = hk * GROUP + j
        G = tl.load(gc_ptr + t64 * HV + h, mask=m, other=0.0)
        p = (qk * tl.exp2(tl.where(causal, G[:, None] - G[None, :], float("-inf")))).to(dt)
        qg = (qb.to(tl.float32) * tl.exp2(G)[:, None]).to(dt)
        for vb in tl.static_range(V // BV):
            cv = vb * BV + tl.arange(0, BV)
            vn = tl.load(vn_ptr + t64[:, None] * s_vt + h * V + cv[None, :], mask=m[:, None], other=0.0)
            hs = tl.load(hs_ptr + (pid.to(tl.int64) * HV + h) * (K * V) + rk[:, None] * V + cv[None, :])
            o = (tl.dot(qg, hs) + tl.dot(p, vn)) * scale
            tl.store(o_ptr + t64[:, None] * s_ot + h * V + cv[None, :], o.to(dt), mask=m[:, None])


def state_block(n_seq: int, hv: int, v: int, sms: int = SMS) -> int:
    """V columns per state-kernel program: 64, or 32 when sequences x heads x (V / 64) programs
    would not fill two programs per SM (the serial loop wants more programs, not wider ones)."""
    return 64 if v >= 64 and n_seq * hv * (v // 64) >= 2 * sms else min(32, v)


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
        cu_seqlens: torch.Tensor, state_pool: torch.Tensor, state_indices: torch.Tensor,
        has_initial_state: torch.Tensor, scale: float) -> torch.Tensor:
    """Chunked Gated DeltaNet prefill; updates ``state_pool`` in place (see the module docstring).

    Raises:
        ValueError: head dims not powers of two in [16, 256], HV not a multiple of HK, or
            non-contiguous inputs.
    """
    T, HK, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    N = state_indices.shape[0]
    if HV % HK or K not in (16, 32, 64, 128, 256) or V not in (16, 32, 64, 128, 256) or not all(
            x.is_contiguous() for x in (q, k, v, g, beta, state_pool)):
        raise ValueError("unsupported head dims, head counts or strides")
    group = HV // HK
    dev = q.device
    nc = T // BT + N                                   # upper bound on the chunks of any length split
    np_ = triton.next_power_of_2(N + 1)
    w = torch.empty((T, HV, K), dtype=q.dtype, device=dev)
    u = torch.empty((T, HV, V), dtype=q.dtype, device=dev)
    vn = torch.empty((T, HV, V), dtype=q.dtype, device=dev)
    gc = torch.empty((T, HV), dtype=torch.float32, device=dev)
    hs = torch.empty((nc, HV, K, V), dtype=q.dtype, device=dev)
    o = torch.empty((T, HV, V), dtype=v.dtype, device=dev)
    init = has_initial_state.view(torch.uint8) if has_initial_state.dtype == torch.bool else has_initial_state
    _wy_kernel[(nc, HV)](k, v, g, beta, cu_seqlens, w, u, gc, N,
                         k.stride(0), v.stride(0), w.stride(0), u.stride(0),
                         HV=HV, GROUP=group, K=K, V=V, BT=BT, BC=BC, NP=np_, num_warps=8)
    bv = state_block(N, HV, V)
    _state_kernel[(V // bv, N * HV)](k, w, u, gc, cu_seqlens, state_pool, state_indices, init, vn, hs, N,
                                     k.stride(0), w.stride(0), u.stride(0),
                                     state_pool.stride(0), state_pool.stride(1),
                                     HV=HV, GROUP=group, K=K, V=V, BT=BT, BV=bv, NP=np_,
                                     num_warps=4, num_stages=2)
    _output_kernel[(nc, HK)](q, k, vn, gc, hs, cu_seqlens, o, N, scale,
                             q.stride(0), k.stride(0), vn.stride(0), o.stride(0),
                             HV=HV, GROUP=group, K=K, V=V, BT=BT, BV=min(V, 32), NP=np_, num_warps=8)
    return o
