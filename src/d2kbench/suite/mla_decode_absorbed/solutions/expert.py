"""Expert Triton solution: MLA decode with weight absorption over the paged latent cache.

Contract (identical to ``reference.run``)
------------------------------------------
``run(q_nope, q_pe, kv_cache, block_table, seq_lens, w_uk, w_uv, scale)`` with
``q_nope [B, H, DN]``, ``q_pe [B, H, DR]`` (bf16; fp16 on CPU smoke workloads),
``kv_cache [NP, PS, DL + DR]`` (latent rows then rotary keys; NaN in rows that hold no valid
token), ``block_table [B, MAXP]`` and ``seq_lens [B]`` int32 on the device, ``w_uk [H, DN, DL]``,
``w_uv [H, DL, DV]``; returns ``o [B, H, DV]`` in q_nope's dtype.

Design
------
L1 -- absorb the up-projections; attend over the latent as multi-query attention.
    By associativity ``q_nope . (w_uk[h] c) = (q_nope w_uk[h]) . c`` and
    ``sum_t p_t (c_t w_uv[h]) = (sum_t p_t c_t) w_uv[h]``. So the query is projected once into
    latent space (``q_lat = q_nope w_uk[h]``, DL values per head), the scores are
    ``q_lat . c_t + q_pe . k_pe_t`` over the cached rows as they are, the softmax-weighted sum is
    taken over the latents themselves, and ``w_uv`` is applied once per (request, head) to the
    DL-wide result. Nothing proportional to tokens x heads is ever materialised, the per-token
    per-head cost drops from ~2 DL (DN + DV) to 2 (2 DL + DR) FLOPs, and all heads share one
    latent "KV head": the cache is read once per request for all heads (MQA with H rows).

L2 -- dataflow (four kernels).
    1. ``_absorb_kernel``: ``q_lat [B, H, DL]`` from one small GEMM per (head, request tile);
       ``w_uk`` read once per request tile.
    2. ``_latent_kernel``: program = (head block, worker). Workers split the flattened
       (request, page) space of the batch into equal page ranges computed on the device from
       ``seq_lens`` (a request may span several workers, a worker several requests), so every
       program streams the same number of latent bytes whatever the length mix: one balanced
       wave, no long tail. For each (request, page range) piece the head block's ``q_lat`` and
       ``q_pe`` rows are loaded once; per tile of one page, the latent tile ``c`` and the rotary
       tile are loaded once and serve both products (``S = q_lat c^T + q_pe k_pe^T`` and
       ``acc += P c``: K and V alias), online softmax in fp32 registers (exp2, scale folded). Each
       piece writes a normalised DL-wide fp32 partial and its log2-sum-exp at slot
       ``worker + request`` (unique: a worker's requests increase with the worker).
    3. ``_combine_kernel``: program = (request, head tile, slice of DL): loads the request's
       pieces as one [pieces, heads, columns] tile (deep piece tiles when few long requests have
       many pieces, many heads per tile when short requests have few) and merges them with LSE
       weights in latent space.
    4. ``_up_proj_kernel``: program = (head, request tile): ``o = merged @ w_uv[h]`` on tensor
       cores, ``w_uv[h]`` read once per request tile: the up-projection runs once per
       (request, head), after the merge.

L3 -- execution.
    Head blocking by the head count: up to 16 heads are one 16-row tile (mma on 16 rows, 4 warps:
    the latent is read exactly once per request; the kernel stays bandwidth-bound); 128 heads
    are two 64-row blocks (8 warps, the 512-wide fp32 accumulator split across two warpgroups),
    adjacent in the grid so the second block reads the latent tiles from L2 (tensor-core-bound
    shape). A page of 64 tokens is one tile: the page id is one scalar load and the tile is a
    contiguous 64 x (DL + DR) box, loaded with 16-byte vectors through a software pipeline;
    only a request's last page is masked (``other=0``: the NaN rows are never read). Worker count
    from the SM count and the head blocks; tile depth, warps and stages by autotuning.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
LOG2E = 1.4426950408889634


def _latent_configs() -> list[triton.Config]:
    """Autotune candidates (BLOCK_H, BLOCK_N, warps, stages), BLOCK_N dividing the page. Up to 16
    heads: one 16-row tile (mma on 16 rows; the latent read once per request). More heads: 32-row
    tiles (mma.sync, no register spills at sm_90, four head blocks sharing each latent tile through
    the L2) or 64-row tiles (wgmma on two warpgroups that split the 512 accumulator columns, a
    little spilling at sm_90): measured choice."""
    if _INTERPRET:
        return [triton.Config({"BLOCK_H": bh, "BLOCK_N": 16}, num_warps=1, num_stages=1) for bh in (16, 64)]
    return [triton.Config({"BLOCK_H": bh, "BLOCK_N": bn}, num_warps=w, num_stages=s)
            for bh, bn, w, s in ((16, 32, 4, 3), (16, 32, 4, 4), (16, 16, 4, 4), (16, 64, 8, 2), (16, 32, 8, 3),
                                 (32, 32, 8, 3), (32, 64, 8, 2), (64, 32, 8, 3), (64, 64, 8, 2))]


def _interpreter_bench(fn, quantiles=None, **kwargs):
    """The CPU interpreter has no timer: after pruning a single candidate is left, nothing to time."""
    return [1.0, 1.0, 1.0] if quantiles else 1.0


def _prune(configs, named_args, **kwargs):
    """16-row tiles when H <= 16, larger ones otherwise; BLOCK_N must divide the page."""
    H = named_args.get("H", kwargs.get("H"))
    page = named_args.get("PAGE", kwargs.get("PAGE"))
    kept = [c for c in configs if (c.kwargs["BLOCK_H"] == 16) == (H <= 16) and page % c.kwargs["BLOCK_N"] == 0]
    return kept or configs[:1]


@triton.jit
def _absorb_kernel(QN, WUK, QL, B, stride_qb, stride_qh, stride_lb, stride_lh,
                   DN: tl.constexpr, DL: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_L: tl.constexpr):
    """Grid (H, cdiv(B, BLOCK_B), DL // BLOCK_L): q_lat[b, h, l] = sum_n q_nope[b, h, n] w_uk[h, n, l]."""
    h = tl.program_id(0)
    b = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.program_id(2) * BLOCK_L + tl.arange(0, BLOCK_L)
    n = tl.arange(0, DN)
    b_ok = b < B
    q = tl.load(QN + b[:, None].to(tl.int64) * stride_qb + h * stride_qh + n[None, :], mask=b_ok[:, None], other=0.0)
    w = tl.load(WUK + h.to(tl.int64) * DN * DL + n[:, None] * DL + cols[None, :])
    ql = tl.dot(q, w)
    tl.store(QL + b[:, None].to(tl.int64) * stride_lb + h * stride_lh + cols[None, :], ql.to(QL.dtype.element_ty),
             mask=b_ok[:, None])


@triton.jit
def _schedule(SL, B, NW, BP2: tl.constexpr, PAGE: tl.constexpr):
    """The balanced page split, recomputed by every program from ``seq_lens``: per request its
    length, page count and inclusive page prefix sum (vectors over BP2 >= B), and the pages per
    worker."""
    idx = tl.arange(0, BP2)
    lens = tl.load(SL + idx, mask=idx < B, other=0)
    pages = tl.cdiv(lens, PAGE)
    cum = tl.cumsum(pages, 0)
    per_worker = tl.cdiv(tl.sum(pages, 0), NW)
    return idx, lens, pages, cum, per_worker


@triton.autotune(configs=_latent_configs(), key=["H", "DL", "DR", "PAGE", "BP2"],
                 prune_configs_by={"early_config_prune": _prune}, do_bench=_interpreter_bench if _INTERPRET else None)
@triton.jit
def _latent_kernel(QL, QP, KV, BT, SL, OP, LP, qk_scale, B, H, NW,
                   stride_lb, stride_lh, stride_pb, stride_ph, stride_kp, stride_ks, stride_bt,
                   DL: tl.constexpr, DR: tl.constexpr, PAGE: tl.constexpr, BP2: tl.constexpr,
                   BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr):
    """Grid (H // BLOCK_H rounded up, NW): worker ``w`` attends its equal share of the batch's
    pages for heads [hb * BLOCK_H, +BLOCK_H). Each (request, page range) piece writes
    OP[w + b, h, :] (fp32 normalised latent output) and LP[w + b, h] (log2-sum-exp)."""
    hb = tl.program_id(0)
    w = tl.program_id(1)
    idx, lens, pages, cum, per_worker = _schedule(SL, B, NW, BP2, PAGE)
    total = tl.sum(pages, 0)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = heads < H
    offs_l = tl.arange(0, DL)
    offs_r = tl.arange(0, DR)
    offs_n = tl.arange(0, BLOCK_N)
    cur = w * per_worker
    end = tl.minimum(cur + per_worker, total)
    while cur < end:
        b = tl.sum((cum <= cur).to(tl.int32), 0)                 # the request holding page cur
        this = idx == b
        first = tl.sum(tl.where(this, cum - pages, 0), 0)
        seg_end = tl.minimum(end, tl.sum(tl.where(this, cum, 0), 0))
        seq_len = tl.sum(tl.where(this, lens, 0), 0)
        b64 = b.to(tl.int64)
        ql = tl.load(QL + b64 * stride_lb + heads[:, None] * stride_lh + offs_l[None, :], mask=h_ok[:, None], other=0.0)
        qp = tl.load(QP + b64 * stride_pb + heads[:, None] * stride_ph + offs_r[None, :], mask=h_ok[:, None], other=0.0)
        m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, DL], dtype=tl.float32)
        t_hi = tl.minimum((seg_end - first) * PAGE, seq_len)
        for start in range((cur - first) * PAGE, t_hi, BLOCK_N):
            page = tl.load(BT + b64 * stride_bt + start // PAGE).to(tl.int64)
            slot = start % PAGE + offs_n
            ok = start + offs_n < t_hi
            row = KV + page * stride_kp + slot[:, None].to(tl.int64) * stride_ks
            c = tl.load(row + offs_l[None, :], mask=ok[:, None], other=0.0)              # latent = K and V
            kpe = tl.load(row + DL + offs_r[None, :], mask=ok[:, None], other=0.0)
            s = (tl.dot(ql, tl.trans(c)) + tl.dot(qp, tl.trans(kpe))) * qk_scale
            s = tl.where(ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = tl.dot(p.to(c.dtype), c, acc * alpha[:, None])
            m_i = m_new
        part = (w + b64) * H + heads
        tl.store(OP + part[:, None] * DL + offs_l[None, :], acc / l_i[:, None], mask=h_ok[:, None])
        tl.store(LP + part, m_i + tl.log2(l_i), mask=h_ok)
        cur = seg_end


@triton.jit
def _combine_kernel(OP, LP, SL, ML, B, H, NW, stride_mb, stride_mh,
                    DL: tl.constexpr, PAGE: tl.constexpr, BP2: tl.constexpr,
                    PT: tl.constexpr, HT: tl.constexpr, BLOCK_K: tl.constexpr):
    """Grid (B, cdiv(H, HT), DL // BLOCK_K): merge the pieces of request b (slots w + b for the
    workers w that hold its pages) for HT heads and BLOCK_K latent columns, PT pieces per load
    (a [PT, HT, BLOCK_K] tile), online across tiles: merged = sum_j 2^(LP_j - m) OP_j / sum_j
    2^(LP_j - m). Writes ML[b, h, cols] (the MMA input dtype of the up-projection)."""
    b = tl.program_id(0)
    hh = tl.program_id(1) * HT + tl.arange(0, HT)
    cols = tl.program_id(2) * BLOCK_K + tl.arange(0, BLOCK_K)
    h_ok = hh < H
    idx, lens, pages, cum, per_worker = _schedule(SL, B, NW, BP2, PAGE)
    this = idx == b
    first = tl.sum(tl.where(this, cum - pages, 0), 0)
    last = tl.sum(tl.where(this, cum, 0), 0) - 1
    w0 = first // per_worker
    n = last // per_worker - w0 + 1                                   # pieces of request b
    jj = tl.arange(0, PT)
    m_i = tl.full([HT], float("-inf"), dtype=tl.float32)
    s_i = tl.zeros([HT], dtype=tl.float32)
    acc = tl.zeros([HT, BLOCK_K], dtype=tl.float32)
    for j0 in range(0, n, PT):
        have = (j0 + jj) < n
        row = (w0 + b + j0 + jj).to(tl.int64)[:, None] * H + hh[None, :]            # [PT, HT] slot x H + h
        ok = have[:, None] & h_ok[None, :]
        lse2 = tl.load(LP + row, mask=ok, other=float("-inf"))
        part = tl.load(OP + row[:, :, None] * DL + cols[None, None, :], mask=ok[:, :, None], other=0.0)
        m_new = tl.maximum(m_i, tl.max(lse2, 0))
        m_safe = tl.where(h_ok, m_new, 0.0)
        wgt = tl.exp2(lse2 - m_safe[None, :])                                     # [PT, HT]
        alpha = tl.exp2(tl.where(h_ok, m_i, 0.0) - m_safe)
        s_i = s_i * alpha + tl.sum(wgt, 0)
        acc = acc * alpha[:, None] + tl.sum(wgt[:, :, None] * part, 0)
        m_i = m_new
    out = acc / tl.where(h_ok, s_i, 1.0)[:, None]
    tl.store(ML + b.to(tl.int64) * stride_mb + hh[:, None] * stride_mh + cols[None, :], out.to(ML.dtype.element_ty),
             mask=h_ok[:, None])


@triton.jit
def _up_proj_kernel(ML, WUV, O, B, stride_mb, stride_mh, stride_ob, stride_oh,
                    DL: tl.constexpr, DV: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr):
    """Grid (H, cdiv(B, BLOCK_B)): o[b, h, :] = merged[b, h, :] @ w_uv[h] for a tile of requests
    (a tensor-core GEMM over DL in chunks; w_uv[h] read once per tile)."""
    h = tl.program_id(0).to(tl.int64)
    bb = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    b_ok = bb < B
    vv = tl.arange(0, DV)
    out = tl.zeros([BLOCK_B, DV], dtype=tl.float32)
    for k in range(0, DL, BLOCK_K):
        kk = k + tl.arange(0, BLOCK_K)
        x = tl.load(ML + bb[:, None].to(tl.int64) * stride_mb + h * stride_mh + kk[None, :], mask=b_ok[:, None], other=0.0)
        w = tl.load(WUV + h * DL * DV + kk[:, None] * DV + vv[None, :])
        out = tl.dot(x, w, out)
    tl.store(O + bb[:, None].to(tl.int64) * stride_ob + h * stride_oh + vv[None, :], out.to(O.dtype.element_ty),
             mask=b_ok[:, None])


def combine_tiles(B: int, H: int, nw: int) -> tuple[int, int]:
    """``(PT, HT)``: pieces and heads per combine tile (PT x HT <= 64 rows of BLOCK_K columns). A
    request has about ``nw / B + 1`` pieces: few long requests get deep piece tiles for one head,
    many short ones shallow piece tiles over many heads (so the grid is neither tiny nor flooded
    with programs that each read a few hundred bytes)."""
    pt = min(64, triton.next_power_of_2(triton.cdiv(nw, B) + 1))
    ht = max(1, min(triton.next_power_of_2(H), 64 // pt))
    return pt, ht


def workers(H: int, sms: int) -> int:
    """Workers (equal page ranges) of the latent kernel, from the head count and the SM count:
    two per SM when all heads fit one 16-row tile (a bandwidth-bound kernel keeps two streams
    per SM); otherwise one program per SM over the 64-head blocks (a worker is run by every head
    block; the tensor-core-bound programs fill the SMs), which also keeps the partials' traffic
    (one DL-wide fp32 row per piece and head) small."""
    return 2 * sms if H <= 16 else max(1, sms // triton.cdiv(H, 64))


def _sm_count(device: torch.device) -> int:
    if _INTERPRET or device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def run(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
        seq_lens: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor, scale: float) -> torch.Tensor:
    """Absorbed MLA decode.

    Args:
        q_nope: ``[B, H, DN]`` bf16/fp16; q_pe: ``[B, H, DR]``; unit stride on the last dim.
        kv_cache: ``[NP, PS, DL + DR]`` latent pages, contiguous rows.
        block_table: ``[B, MAXP]`` int32 (device); seq_lens: ``[B]`` int32 (device), >= 1.
        w_uk: ``[H, DN, DL]`` and w_uv: ``[H, DL, DV]``, contiguous.
        scale: softmax scale.

    Returns:
        ``o [B, H, DV]`` in q_nope's dtype.
    """
    B, H, DN = q_nope.shape
    DR = q_pe.shape[2]
    _, PS, DC = kv_cache.shape
    DL, DV = w_uv.shape[1], w_uv.shape[2]
    pow2 = all(x == triton.next_power_of_2(x) for x in (DN, DR, DL, DV, PS))
    if DC != DL + DR or not pow2 or DN < 16 or DR < 16 or DV < 16 or PS < 16 or kv_cache.stride(2) != 1 \
            or not (w_uk.is_contiguous() and w_uv.is_contiguous()) or q_nope.stride(2) != 1 or q_pe.stride(2) != 1:
        raise ValueError("unsupported shapes or strides")
    dev = q_nope.device
    bb = 16
    bl = min(DL, 128)
    q_lat = torch.empty((B, H, DL), device=dev, dtype=q_nope.dtype)
    _absorb_kernel[(H, triton.cdiv(B, bb), DL // bl)](q_nope, w_uk, q_lat, B, q_nope.stride(0), q_nope.stride(1),
                                                      q_lat.stride(0), q_lat.stride(1), DN=DN, DL=DL, BLOCK_B=bb,
                                                      BLOCK_L=bl, num_warps=4)
    nw = workers(H, _sm_count(dev))
    bp2 = max(16, triton.next_power_of_2(B))
    op = torch.empty((nw + B, H, DL), device=dev, dtype=torch.float32)
    lp = torch.empty((nw + B, H), device=dev, dtype=torch.float32)
    _latent_kernel[lambda meta: (triton.cdiv(H, meta["BLOCK_H"]), nw)](
        q_lat, q_pe, kv_cache, block_table, seq_lens, op, lp, scale * LOG2E, B, H, nw,
        q_lat.stride(0), q_lat.stride(1), q_pe.stride(0), q_pe.stride(1), kv_cache.stride(0), kv_cache.stride(1),
        block_table.stride(0), DL=DL, DR=DR, PAGE=PS, BP2=bp2)
    merged = torch.empty((B, H, DL), device=dev, dtype=q_nope.dtype)
    pt, ht = combine_tiles(B, H, nw)
    bk = min(DL, 64)
    _combine_kernel[(B, triton.cdiv(H, ht), DL // bk)](op, lp, seq_lens, merged, B, H, nw, merged.stride(0),
                                                     merged.stride(1), DL=DL, PAGE=PS, BP2=bp2, PT=pt, HT=ht,
                                                     BLOCK_K=bk, num_warps=4)
    o = torch.empty((B, H, DV), device=dev, dtype=q_nope.dtype)
    _up_proj_kernel[(H, triton.cdiv(B, bb))](merged, w_uv, o, B, merged.stride(0), merged.stride(1), o.stride(0),
                                             o.stride(1), DL=DL, DV=DV, BLOCK_B=bb, BLOCK_K=min(DL, 64), num_warps=4)
    return o
