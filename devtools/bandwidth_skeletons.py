"""Measured bandwidth ceilings of memory-bound experts: read skeletons in the experts' access patterns.

The memory-bound bar (docs/timing.md) is "at least 70% of the measured HBM ceiling" (the task's
minimal bytes over the mean latency, at the 4.3 TB/s of :data:`d2kbench.scoring.sol.MEASURED`,
a device-to-device copy). Where an expert misses it, two different causes are possible: the
access pattern itself (page gathers through a block table, the grid, the per-program tiles)
cannot stream the bytes faster, or the expert leaves bandwidth on the table (arithmetic,
synchronisation, a tail). This script separates the two. Per registered workload of
:data:`WORKLOADS`, on the inputs of the task's own generator (``make_inputs``: the shapes,
lengths, page tables and dtypes of the workload), it times with the harness's graph timer
(:func:`d2kbench.harness.timing.time_graph`, the benchmark's input-set rotation: enough sets
for 3x the L2, like the worker):

* ``skeleton``: Triton kernels that move exactly the bytes of the task's floor SOL model
  (``task.yaml`` ``sol.floor``; tested on the CPU by :func:`count_bytes`) in the expert's access
  pattern: the expert's grid (programs per launch, split-K / page splits, head blocks), its
  per-program tile shapes (the autotuned config the expert picked on this GPU when one exists)
  and its gathers (the same block-table page lookups, page size and masks). They do no
  arithmetic beyond a reduction that keeps the loads alive: column sums of every loaded tile
  that the expert feeds to an MMA, taken as one MMA with a [16, rows] matrix of ones (so the
  tiles take the expert's operand path: Triton software-pipelines MMA operands through shared
  memory with the launch's ``num_stages``, which it does not do for loads feeding plain
  reductions), at most 1/2 of the expert's MMA work per tile. The result goes to a sink that is
  stored only if it equals an impossible sentinel (no bytes), and the outputs the SOL model
  counts (``o``; lora's ``y`` read-modify-write) are written, nothing else (the experts'
  intermediates: partials, ``q_lat``, the FP32 LoRA buffer, are not part of the SOL bytes and
  are not moved). Skeletons per task:

  - mla_decode_absorbed: (1) the latent stream of ``_latent_kernel``: grid (head blocks, the
    expert's worker count), the same balanced page split recomputed from ``seq_lens``, per piece
    the head block's ``q_pe`` rows, per tile of BLOCK_N tokens one table entry and the
    [BLOCK_N, DL] + [BLOCK_N, DR] latent boxes (masked at the request's end); (2) one program per
    head reading ``w_uk[h]``, ``w_uv[h]`` and ``q_nope[:, h]`` and writing ``o[:, h]`` (what
    the expert's absorb and up-projection launches read and write from the SOL's inputs).
  - cascade_prefix_decode: one launch of ``_cascade_kernel``'s grid: prefix programs (KV head,
    chunk, 64-row tile: every row tile of a chunk reads the whole chunk, the expert's L2 reuse)
    then suffix programs (request, KV head, suffix chunk), per-token page lookups, K and V
    [BLOCK_N, D] tiles; suffix chunk 0 writes the request's ``o`` rows. ``skeleton_split``
    (extra row): the row tiles of a prefix chunk split it instead (each prefix byte requested
    once), the pattern without the L2 re-reads.
  - lora_shrink_expand: the expert's counting sort (its own ``_group_kernel``: the mapping read),
    the shrink grid (row tiles x K splits: gathered x rows and the adapter's [BK, S R] A tiles)
    and the expand grid (row tiles x column blocks: the adapter's B tiles, y's gathered rows read
    and written back unchanged).
  - fused_qkv_norm_rope_cache: the expert's grid, tokens per program and warps (its ``plan``):
    per token the position, slot and float32 cos | sin row, the whole qkv row as [tokens, heads,
    D/2] half tiles; q copied to ``q_out``, k and v copied to the token's cache slot (padding
    tokens: nothing written), no norm, no rotation.
  - allreduce_residual_rmsnorm: the expert's grid and [rows, groups padded to a power of two,
    128] blocks (its ``_tile``), the R partials through R pointer arguments in rank order
    (evict-first), the residual read and written in place, y and the group scales written, at
    arithmetic levels (:data:`AR_LEVELS`): ``skeleton`` the rank sum and residual add only (an
    FP8 y stored as a byte of z w, no conversion, zero scales), ``skeleton_norm`` + the RMSNorm,
    ``skeleton_quant`` + the expert's quantiser (group amax, correctly rounded scale, y / s,
    clamp, FP8 conversion), ``skeleton_quant_rcp`` that quantiser with y * (1 / s). The bytes are
    the same at every level: the rows separate the pattern from the arithmetic.
  - topk_topp_sampling: the logits once and the four per-request parameters, one int64 id
    written per row (the SOL bytes), no arithmetic, in the expert's grid (rows x splits of NT
    tiles of TILE logits, ``expert._config``). ``row_program`` (extra row): the same bytes with
    one program per row (B programs reading V logits each: the grid of a one-program-per-row
    sampler, bounded by what one program streams, not by HBM). The expert taken apart (its own
    kernel, launched like ``expert.run``): ``scan`` the full grid with the split count passed
    as S + 1, so no program finalises (every split pass: tau estimate, online max and
    denominator, candidate compaction, the arrival atomic), and ``finalise`` one program per
    row that rescans split 0 and finalises the row (counters preset to S - 1) on the scratch a
    ``scan`` call filled: expert ~ scan + the finaliser tail; ``split_pass`` the split pass as
    a kernel of its own (no finaliser code compiled in: its own registers and occupancy),
    ``split_pass_small_tile`` the same in 1024-logit tiles with 4 warps (fewer registers per
    thread, more programs per SM), ``split_pass_prefetch`` that with the next tile's load issued
    before the current tile's reductions.
  - w4a16_gemm (the decode workloads; the prefill is compute-bound): the expert's
    ``_awq_fields_mma`` grid and tiles from its ``_plan`` (strips of BP packed words x split-K x
    m tiles; [BM, BK] x and [BK, BP] word tiles, evict-first words, warps, stages), per K step
    the group's zero-point words and scales, y written by split 0 (the expert's FP32 partials and
    reduction pass are not SOL bytes), at arithmetic levels (:data:`W4_LEVELS`): ``skeleton`` no
    unpacking (the words folded to fp16 bits, one MMA x @ fold per step: 1/8 of the expert's
    MMAs), ``skeleton_dequant`` + the expert's unpacking of the 8 fields (its inline-PTX pairs
    where ``_ASM``), summed into that one MMA, ``skeleton_dequant_mma`` + its 8 MMAs per step.
    The bytes are the same at every level: skeleton -> flat is the pattern, skeleton ->
    skeleton_dequant the unpacking, -> skeleton_dequant_mma the MMAs, -> expert the partials
    and the reduction pass.

* ``flat``: the same byte count read from one contiguous buffer (4 programs per SM, 16 KB
  tiles), the best any pattern could do with those bytes on this GPU.
* :data:`COPY_TASKS` (tasks that write as much as they read): ``flat_copy`` a contiguous copy
  that reads and writes the SOL model's bytes in each direction (:func:`sol_split`; 4 programs
  per SM, 8 KB tiles) on rotating buffers of 3x the L2 (cold), ``flat_copy_sets`` the same in
  the benchmark's input-set rotation (one set when the arguments exceed the L2: the data stays
  L2-resident between replays, as the task's own small rows do), ``torch_copy`` /
  ``torch_copy_sets`` PyTorch's device-to-device ``copy_`` of the same total bytes (the measured
  ceiling's own method). :data:`RAMP_TASKS` add the cold copy at 1, 2 and 8 programs per SM and
  at 4x and 16x the bytes; the markdown fits time = fixed cost + bytes / rate through the 1x,
  4x and 16x copies (:func:`ramp_line`): how close one launch of this size can come to the
  ceiling at all (launch, ramp and tail).
* ``expert``: the expert on the same input sets, same timer.

The rows give SOL bytes, ms, achieved TB/s and % of the measured HBM ceiling for each; a
skeleton far below the flat read says the pattern caps the bandwidth, an expert far below its
skeleton says the expert leaves bandwidth on the table. With ``COMPUTE`` (mla
``dsv3_dp_b64_h128``, a compute-bound bar) two compute skeletons run the expert's MMAs on
L2-resident tiles with the expert's grid, head block and tile depth and its tiles per program:
``mma`` the three MMAs per tile only (``S = q_lat c^T + q_pe k_pe^T``, ``acc += P c`` with P the
scores cast to bf16), ``mma_softmax`` with the online softmax between them (the expert's inner
loop without HBM traffic); % of the 790 TFLOP/s bf16 ceiling counts the task's tensor-core SOL
FLOPs. For the cascade workloads ``prefix_mma_softmax`` runs the expert's prefix programs alone
(the same grid, 64-row q tiles and chunk lengths) on L2-resident K/V tiles: the time the
tensor-core half of the cascade needs with no HBM traffic (the expert overlaps it with the
suffix stream on the same SMs).

Usage (repo root)::

    PYTHONPATH=src python3 devtools/bandwidth_skeletons.py [--only TASK/WORKLOAD ...] [--budget-s 100]
        [--candidate SOLUTION.py ...] [--json FILE] [--markdown FILE]          # a GPU
    PYTHONPATH=src TRITON_INTERPRET=1 python devtools/bandwidth_skeletons.py --dry-run   # host logic, CPU
    PYTHONPATH=src python devtools/bandwidth_skeletons.py --compile-only   # no GPU: sm_90 compile

``--compile-only`` builds the launches of every skeleton at the registered shapes with the
H200's 132 SMs (empty tensors of the workload's shapes; the host code reads no values) and
compiles them for sm_90 through devtools/compile_sm90.py's stand-in driver. The CPU test
(tests/test_bandwidth_skeletons.py) runs the skeletons under the interpreter on small
workloads and checks with :func:`count_bytes` that the distinct bytes they read and write are the
task's SOL bytes. Diagnostic, not a benchmark.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
# Imports inside functions: d2kbench's harness and task loaders only where used (compile-only
# must switch Triton's driver before any task module compiles; the CPU test needs none of them).

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
#: The sink is stored only when a reduction equals this (never, for finite inputs: no bytes).
SENTINEL = 1.0e30
#: Registered workloads that miss the memory-bound bar (task, workload), interleaved by task so
#: that a run cut short by ``--budget-s`` still covers every task.
WORKLOADS = [
    ("mla_decode_absorbed", "dsv3_tp8_b64"),
    ("cascade_prefix_decode", "llama31_70b_tp8_n256"),
    ("lora_shrink_expand", "llama31_70b_down_t2048"),
    ("mla_decode_absorbed", "dsv3_dp_b64_h128"),
    ("cascade_prefix_decode", "llama31_8b_parallel_n128"),
    ("lora_shrink_expand", "llama31_8b_qkv_prefill_t8192"),
    ("mla_decode_absorbed", "kimi_k2_tp4_b4_l128k"),
    ("cascade_prefix_decode", "qwen3_32b_sysprompt_n64"),
    ("lora_shrink_expand", "llama31_8b_gateup_decode_t256"),
    ("fused_qkv_norm_rope_cache", "qwen3_8b_decode_t256"),
    ("allreduce_residual_rmsnorm", "dsv3_tp8_t2048_fp8g128"),
    ("allreduce_residual_rmsnorm", "llama31_70b_tp8_t4096"),    # passes (91%): the bf16 contrast
    ("topk_topp_sampling", "qwen3_b256_kp"),
    ("topk_topp_sampling", "llama3_b128_kp"),
    ("topk_topp_sampling", "dsv3_b64_k"),
    ("w4a16_gemm", "llama3_70b_gate_up_m1"),         # the memory-bound (decode) workloads only
    ("w4a16_gemm", "llama3_70b_down_m16"),
]
#: Workloads with a compute skeleton (a compute-bound bar).
COMPUTE = [("mla_decode_absorbed", "dsv3_dp_b64_h128")]
#: Byte slack of the SOL formulas against an exact count (documented approximations in task.yaml):
#: mla and cascade count table entries as tokens / page size (a request reads ceil(tokens / page)
#: entries: < 4 bytes per request more); lora counts slice_offsets' S + 1 entries, a kernel needs
#: only the S - 1 inner boundaries (8 bytes fewer).
SLACK = {"mla_decode_absorbed": lambda ax: 4 * ax["B"], "cascade_prefix_decode": lambda ax: 4 * ax["N"],
         "lora_shrink_expand": lambda ax: 8, "allreduce_residual_rmsnorm": lambda ax: 0,
         "topk_topp_sampling": lambda ax: 0, "w4a16_gemm": lambda ax: 0}
#: Tasks whose rows include contiguous copies of the SOL bytes (reads and writes as the SOL
#: model splits them, :func:`sol_split`): in the benchmark's input sets (``flat_copy_sets``: the
#: expert's rotation; one set when the arguments exceed the L2, as the 0.5 GB KV pools of the
#: fused_qkv decode workload do, so its 6 MB of rows stay L2-resident between replays) and in
#: rotating buffers of 3x the L2 (``flat_copy``, cold), plus PyTorch's ``copy_``.
COPY_TASKS = ("fused_qkv_norm_rope_cache", "allreduce_residual_rmsnorm")
#: Tasks with the launch-ramp rows: the cold copy at 1, 2, 4 and 8 programs per SM and at 4x and
#: 16x the bytes (the fixed cost of one launch: the intercept of time over bytes).
RAMP_TASKS = ("fused_qkv_norm_rope_cache",)
H200_SMS = 132
#: Tile (logits per loop step) of the sampler's ``split_pass_small_tile`` skeleton.
SMALL_TILE = 1024
MEASURED_HBM_TBPS = 4.3   # replaced by d2kbench.scoring.sol.ceilings(gpu, "measured") where it knows the GPU
MEASURED_BF16_TFLOPS = 790.0


# ----------------------------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------------------------

@triton.jit
def _sink(SINK, pid, total):
    """Keep ``total`` (and the loads it reduces) alive without moving a byte."""
    tl.store(SINK + pid, total, mask=total == 1.0e30)


@triton.jit
def _page_split(SL, B, NW, BP2: tl.constexpr, PAGE: tl.constexpr):
    """The mla expert's balanced page split (``_schedule``): lengths, pages, inclusive page prefix
    sums over BP2 >= B requests, and the pages per worker."""
    idx = tl.arange(0, BP2)
    lens = tl.load(SL + idx, mask=idx < B, other=0)
    pages = tl.cdiv(lens, PAGE)
    cum = tl.cumsum(pages, 0)
    per_worker = tl.cdiv(tl.sum(pages, 0), NW)
    return idx, lens, pages, cum, per_worker


@triton.jit
def _mla_latent_read(QP, KV, BT, SL, SINK, B, H, NW, stride_pb, stride_ph, stride_kp, stride_ks, stride_bt,
                     DL: tl.constexpr, DR: tl.constexpr, PAGE: tl.constexpr, BP2: tl.constexpr,
                     BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr):
    """Grid (cdiv(H, BLOCK_H), NW): the expert's latent-kernel reads (q_pe rows per piece, one
    table entry and a [BLOCK_N, DL + DR] latent box per tile), reduced into the sink."""
    hb = tl.program_id(0)
    w = tl.program_id(1)
    idx, lens, pages, cum, per_worker = _page_split(SL, B, NW, BP2, PAGE)
    total = tl.sum(pages, 0)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = heads < H
    offs_l = tl.arange(0, DL)
    offs_r = tl.arange(0, DR)
    offs_n = tl.arange(0, BLOCK_N)
    ones = tl.full([16, BLOCK_N], 1.0, dtype=KV.dtype.element_ty)
    acc_l = tl.zeros([16, DL], dtype=tl.float32)
    acc_r = tl.zeros([16, DR], dtype=tl.float32)
    qsum = tl.zeros([BLOCK_H], dtype=tl.float32)
    cur = w * per_worker
    end = tl.minimum(cur + per_worker, total)
    while cur < end:
        b = tl.sum((cum <= cur).to(tl.int32), 0)
        this = idx == b
        first = tl.sum(tl.where(this, cum - pages, 0), 0)
        seg_end = tl.minimum(end, tl.sum(tl.where(this, cum, 0), 0))
        seq_len = tl.sum(tl.where(this, lens, 0), 0)
        b64 = b.to(tl.int64)
        qp = tl.load(QP + b64 * stride_pb + heads[:, None] * stride_ph + offs_r[None, :], mask=h_ok[:, None], other=0.0)
        qsum += tl.sum(qp.to(tl.float32), 1)
        t_hi = tl.minimum((seg_end - first) * PAGE, seq_len)
        for start in range((cur - first) * PAGE, t_hi, BLOCK_N):
            page = tl.load(BT + b64 * stride_bt + start // PAGE).to(tl.int64)
            slot = start % PAGE + offs_n
            ok = start + offs_n < t_hi
            row = KV + page * stride_kp + slot[:, None].to(tl.int64) * stride_ks
            c = tl.load(row + offs_l[None, :], mask=ok[:, None], other=0.0)
            kpe = tl.load(row + DL + offs_r[None, :], mask=ok[:, None], other=0.0)
            acc_l = tl.dot(ones, c, acc_l)                 # column sums on the tensor cores: the
            acc_r = tl.dot(ones, kpe, acc_r)               # tiles take the expert's MMA-operand path
        cur = seg_end
    _sink(SINK, hb * NW + w, tl.sum(tl.sum(acc_l, 1), 0) + tl.sum(tl.sum(acc_r, 1), 0) + tl.sum(qsum, 0))


@triton.jit
def _mla_heads_rw(QN, WUK, WUV, O, B, stride_qb, stride_qh, stride_ob, stride_oh,
                  DN: tl.constexpr, DL: tl.constexpr, DV: tl.constexpr, BP2: tl.constexpr, BK: tl.constexpr):
    """Grid (H,): head h reads w_uk[h] [DN, DL], w_uv[h] [DL, DV] and q_nope[:, h] and writes
    o[:, h] (its reduction broadcast): the SOL's weight, query and output bytes."""
    h = tl.program_id(0).to(tl.int64)
    bb = tl.arange(0, BP2)
    b_ok = bb < B
    n = tl.arange(0, DN)
    v = tl.arange(0, DV)
    kk = tl.arange(0, BK)
    acc = tl.zeros([BK], dtype=tl.float32)
    for k in range(0, DL, BK):
        wk = tl.load(WUK + h * DN * DL + n[:, None] * DL + (k + kk)[None, :])
        wv = tl.load(WUV + h * DL * DV + (k + kk)[:, None] * DV + v[None, :])
        acc += tl.sum(wk.to(tl.float32), 0) + tl.sum(wv.to(tl.float32), 1)
    q = tl.load(QN + bb[:, None].to(tl.int64) * stride_qb + h * stride_qh + n[None, :], mask=b_ok[:, None], other=0.0)
    tot = tl.sum(q.to(tl.float32), 1) + tl.sum(acc, 0)                      # [BP2]
    out = tl.zeros([BP2, DV], dtype=tl.float32) + tot[:, None]
    tl.store(O + bb[:, None].to(tl.int64) * stride_ob + h * stride_oh + v[None, :], out.to(O.dtype.element_ty),
             mask=b_ok[:, None])


@triton.jit
def _mla_mma(C, QL, QP, SINK, tiles, qk_scale, DL: tl.constexpr, DR: tl.constexpr, BLOCK_H: tl.constexpr,
             BLOCK_N: tl.constexpr, TILES: tl.constexpr, SOFTMAX: tl.constexpr):
    """Grid (head blocks, NW): ``tiles`` latent tiles per program cycling over TILES L2-resident
    [BLOCK_N, DL + DR] boxes; per tile S = q_lat c^T + q_pe k_pe^T and acc += P c (P: the scores
    cast, or with SOFTMAX the expert's online softmax)."""
    pid = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    rh = tl.arange(0, BLOCK_H)
    offs_l = tl.arange(0, DL)
    offs_r = tl.arange(0, DR)
    offs_n = tl.arange(0, BLOCK_N)
    ql = tl.load(QL + rh[:, None] * DL + offs_l[None, :])
    qp = tl.load(QP + rh[:, None] * DR + offs_r[None, :])
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, DL], dtype=tl.float32)
    for t in range(tiles):
        j = (pid + t) % TILES
        row = C + (j * BLOCK_N + offs_n)[:, None].to(tl.int64) * (DL + DR)
        c = tl.load(row + offs_l[None, :])
        kpe = tl.load(row + DL + offs_r[None, :])
        s = tl.dot(ql, tl.trans(c)) + tl.dot(qp, tl.trans(kpe))
        if SOFTMAX:
            s = s * qk_scale
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = tl.dot(p.to(c.dtype), c, acc * alpha[:, None])
            m_i = m_new
        else:
            acc = tl.dot(s.to(c.dtype), c, acc)
    _sink(SINK, pid, tl.sum(tl.sum(acc, 1), 0) + tl.sum(l_i, 0))


@triton.jit
def _cascade_read(Q, KC, VC, BT, SL, O, SINK, P, N, PC, SC,
                  stride_qn, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
                  stride_bt, stride_on, stride_oh,
                  HKV: tl.constexpr, GROUP: tl.constexpr, QROWS: tl.constexpr, HEAD_DIM: tl.constexpr,
                  PAGE: tl.constexpr, ROW_TILES: tl.constexpr, NPC: tl.constexpr, NSC: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_PREFIX: tl.constexpr):
    """Grid (HKV * NPC * ROW_TILES + N * HKV * NSC,): the cascade expert's reads. Prefix programs
    (row tile, chunk, KV head): the 64-row q tile and the chunk's K/V through table row 0 (with
    SPLIT_PREFIX, 1/ROW_TILES of it); suffix programs (request, KV head, chunk): the GROUP q rows,
    the length, the request's pages; chunk 0 writes the request's o rows of that KV head."""
    pid = tl.program_id(0)
    n_pre = HKV * NPC * ROW_TILES
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    ones = tl.full([16, BLOCK_N], 1.0, dtype=KC.dtype.element_ty)
    acc_k = tl.zeros([16, HEAD_DIM], dtype=tl.float32)
    acc_v = tl.zeros([16, HEAD_DIM], dtype=tl.float32)
    if pid < n_pre:
        rt = pid % ROW_TILES
        c = (pid // ROW_TILES) % NPC
        kvh = pid // (ROW_TILES * NPC)
        r = rt * BLOCK_M + tl.arange(0, BLOCK_M)
        r_ok = r < N * GROUP
        req = (r // GROUP).to(tl.int64)
        head = kvh * GROUP + r % GROUP
        q_pre = tl.load(Q + req[:, None] * stride_qn + head[:, None] * stride_qh + offs_d[None, :],
                        mask=r_ok[:, None], other=0.0)
        qsum = tl.sum(tl.sum(q_pre.to(tl.float32), 1), 0)
        lo = c * PC
        hi = tl.minimum(lo + PC, P)
        if SPLIT_PREFIX:
            sub = tl.cdiv(tl.cdiv(hi - lo, ROW_TILES), BLOCK_N) * BLOCK_N
            lo = tl.minimum(lo + rt * sub, hi)
            hi = tl.minimum(lo + sub, hi)
        bt_row = BT
        k_head = KC + kvh.to(tl.int64) * stride_kh
        v_head = VC + kvh.to(tl.int64) * stride_vh
        i = kvh.to(tl.int64) * 0                      # (suffix names, unused by prefix programs)
        heads = tl.arange(0, QROWS)
        row_ok = heads < 0
    else:
        ps = pid - n_pre
        c = ps % NSC
        kvh = (ps // NSC) % HKV
        i = (ps // (NSC * HKV)).to(tl.int64)
        seq_len = tl.load(SL + i)
        rows = tl.arange(0, QROWS)
        row_ok = rows < GROUP
        heads = kvh * GROUP + rows
        q_suf = tl.load(Q + i * stride_qn + heads[:, None] * stride_qh + offs_d[None, :], mask=row_ok[:, None],
                        other=0.0)
        qsum = tl.sum(tl.sum(q_suf.to(tl.float32), 1), 0)
        lo = P + c * SC
        hi = tl.minimum(lo + SC, seq_len)
        bt_row = BT + i * stride_bt
        k_head = KC + kvh.to(tl.int64) * stride_kh
        v_head = VC + kvh.to(tl.int64) * stride_vh
    for start in range(lo, hi, BLOCK_N):
        tok = start + offs_n
        ok = tok < hi
        page = tl.load(bt_row + tok // PAGE, mask=ok, other=0).to(tl.int64)
        slot = (tok % PAGE).to(tl.int64)
        k = tl.load(k_head + (page * stride_kp + slot * stride_ks)[:, None] + offs_d[None, :], mask=ok[:, None], other=0.0)
        v = tl.load(v_head + (page * stride_vp + slot * stride_vs)[:, None] + offs_d[None, :], mask=ok[:, None], other=0.0)
        acc_k = tl.dot(ones, k, acc_k)                     # column sums on the tensor cores (the
        acc_v = tl.dot(ones, v, acc_v)                     # expert's MMA-operand path for K and V)
    tot = tl.sum(tl.sum(acc_k + acc_v, 1), 0) + qsum
    if pid >= n_pre:
        if c == 0:
            out = tl.zeros([QROWS, HEAD_DIM], dtype=tl.float32) + tot
            tl.store(O + i * stride_on + heads[:, None] * stride_oh + offs_d[None, :], out.to(O.dtype.element_ty),
                     mask=row_ok[:, None])
        else:
            _sink(SINK, pid, tot)
    else:
        _sink(SINK, pid, tot)


@triton.jit
def _cascade_prefix_mma(KV, Q, SINK, P, PC, qk_scale, HEAD_DIM: tl.constexpr, ROW_TILES: tl.constexpr,
                        NPC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TILES: tl.constexpr):
    """Grid (HKV * NPC * ROW_TILES,): the cascade expert's prefix programs without HBM traffic:
    chunk c's tokens in BLOCK_N tiles cycling over TILES L2-resident [BLOCK_N, HEAD_DIM] K and V
    tiles, the expert's online softmax step (Q K^T, exp2, rescale, P V) for a BLOCK_M-row q tile."""
    pid = tl.program_id(0)
    c = (pid // ROW_TILES) % NPC
    n = tl.minimum(PC, P - c * PC)
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rd = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + rm[:, None] * HEAD_DIM + rd[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for t in range(0, tl.cdiv(n, BLOCK_N)):
        j = (pid + t) % TILES
        k = tl.load(KV + (2 * j * BLOCK_N + rn)[:, None] * HEAD_DIM + rd[None, :])
        v = tl.load(KV + ((2 * j + 1) * BLOCK_N + rn)[:, None] * HEAD_DIM + rd[None, :])
        s = tl.dot(q, tl.trans(k)) * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    _sink(SINK, pid, tl.sum(tl.sum(acc, 1), 0) + tl.sum(l_i, 0))


@triton.jit
def _lora_tile_of(counts_ptr, j, L, BM: tl.constexpr, LP: tl.constexpr):
    """Adapter, first sorted row and end row of row tile j (the lora expert's ``_tile_of``)."""
    lanes = tl.arange(0, LP)
    cnt = tl.load(counts_ptr + lanes, mask=lanes < L, other=0)
    ntiles = (cnt + BM - 1) // BM
    tends = tl.cumsum(ntiles, 0)
    ends = tl.cumsum(cnt, 0)
    lora = tl.sum((tends <= j).to(tl.int32), axis=0)
    sel = lanes == lora
    tstart = tl.sum(tl.where(sel, tends - ntiles, 0), axis=0)
    start = tl.sum(tl.where(sel, ends - cnt, 0), axis=0)
    end = tl.sum(tl.where(sel, ends, 0), axis=0)
    return lora, start + (j - tstart) * BM, end


@triton.jit
def _lora_shrink_read(x_ptr, a_ptr, sorted_ptr, counts_ptr, SINK, L, K, k_per_split, SR,
                      stride_xt, stride_as, stride_al, stride_ar,
                      R: tl.constexpr, SRP: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, LP: tl.constexpr):
    """Grid (cdiv(T, BM) + L, K splits): the lora expert's shrink reads (gathered [BM, BK] x
    tiles and the adapter's [BK, S R] A tiles over this program's K range), into the sink."""
    j = tl.program_id(0)
    lora, row0, row_end = _lora_tile_of(counts_ptr, j, L, BM, LP)
    if lora >= L:
        return
    rows = row0 + tl.arange(0, BM)
    rmask = rows < row_end
    tok = tl.load(sorted_ptr + rows, mask=rmask, other=0).to(tl.int64)
    q = tl.arange(0, SRP)
    qmask = q < SR
    a_rows = (q // R).to(tl.int64) * stride_as + lora.to(tl.int64) * stride_al + (q % R) * stride_ar
    k_lo = tl.program_id(1) * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    rk = tl.arange(0, BK)
    ones_m = tl.full([16, BM], 1.0, dtype=x_ptr.dtype.element_ty)
    ones_k = tl.full([16, BK], 1.0, dtype=a_ptr.dtype.element_ty)
    accx = tl.zeros([16, BK], dtype=tl.float32)
    acca = tl.zeros([16, SRP], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BK):
        kin = (k0 + rk) < k_hi
        xt = tl.load(x_ptr + tok[:, None] * stride_xt + (k0 + rk)[None, :], mask=rmask[:, None] & kin[None, :], other=0.0)
        at = tl.load(a_ptr + a_rows[None, :] + (k0 + rk)[:, None], mask=kin[:, None] & qmask[None, :], other=0.0)
        accx = tl.dot(ones_m, xt, accx)                   # column sums on the tensor cores (the
        acca = tl.dot(ones_k, at, acca)                   # expert's MMA-operand path for x and A)
    _sink(SINK, j * tl.num_programs(1) + tl.program_id(1), tl.sum(tl.sum(accx, 1), 0) + tl.sum(tl.sum(acca, 1), 0))


@triton.jit
def _lora_expand_rmw(b_ptr, y_ptr, sorted_ptr, counts_ptr, offs_ptr, L, N, S,
                     stride_bl, stride_bn, stride_yt,
                     R: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, LP: tl.constexpr, SP: tl.constexpr):
    """Grid (cdiv(T, BM) + L, cdiv(N, BN)): the lora expert's expand traffic: the slice bounds,
    the adapter's [R, BN] B tile of every slice the block touches, y's gathered [BM, BN] rows read
    and written back unchanged (+ 0 x the B reduction, which keeps those loads alive)."""
    j = tl.program_id(0)
    lora, row0, row_end = _lora_tile_of(counts_ptr, j, L, BM, LP)
    if lora >= L:
        return
    rows = row0 + tl.arange(0, BM)
    rmask = rows < row_end
    tok = tl.load(sorted_ptr + rows, mask=rmask, other=0).to(tl.int64)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    nmask = cols < N
    sb = tl.arange(0, SP)
    bounds = tl.load(offs_ptr + 1 + sb, mask=sb < S - 1, other=2147483647)
    col_slice = tl.sum((cols[:, None] >= bounds[None, :]).to(tl.int32), axis=1)
    s_first = tl.min(tl.where(nmask, col_slice, S), axis=0)
    s_last = tl.max(tl.where(nmask, col_slice, 0), axis=0)
    rr = tl.arange(0, R)
    b_base = b_ptr + lora.to(tl.int64) * stride_bl + cols[None, :].to(tl.int64) * stride_bn + rr[:, None]
    y_ptrs = y_ptr + tok[:, None] * stride_yt + cols[None, :]
    ymask = rmask[:, None] & nmask[None, :]
    yv = tl.load(y_ptrs, mask=ymask, other=0.0)
    ones = tl.full([16, R], 1.0, dtype=b_ptr.dtype.element_ty)
    accb = tl.zeros([16, BN], dtype=tl.float32)
    for s in range(s_first, s_last + 1):
        bt = tl.load(b_base, mask=(nmask & (col_slice == s))[None, :], other=0.0)
        accb = tl.dot(ones, bt, accb)                     # the B tile as an MMA operand, like the expert's
    out = yv.to(tl.float32) + (tl.sum(accb, 0) * 0.0)[None, :]
    tl.store(y_ptrs, out.to(y_ptr.dtype.element_ty), mask=ymask)


@triton.jit
def _flat_read(X, SINK, n, per_prog, BLOCK: tl.constexpr):
    """Program p reads X[p * per_prog, (p + 1) * per_prog) (clipped to n) in BLOCK-element tiles."""
    pid = tl.program_id(0)
    lo = pid.to(tl.int64) * per_prog
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(0, per_prog, BLOCK):
        idx = lo + s + offs
        acc += tl.load(X + idx, mask=(idx < n) & (s + offs < per_prog), other=0.0).to(tl.float32)
    _sink(SINK, pid, tl.sum(acc, 0))


@triton.jit
def _qkv_rows(QKV, CS, POS, KC, VC, SLOTS, QO, T, stride_t, stride_cs, stride_qt, stride_kcp, stride_kcs,
              stride_vcp, stride_vcs, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
              TOK: tl.constexpr, HQ_P: tl.constexpr, HKV_P: tl.constexpr, HALF_P: tl.constexpr):
    """Grid (cdiv(T, TOK),): the fused_qkv expert's traffic without its arithmetic. Per token the
    position, slot and float32 cos | sin row, the whole qkv row as [TOK, heads, D/2] half tiles;
    q copied to q_out, k and v copied to the token's cache slot (slot -1: nothing written). The
    cos/sin row is reduced per token and folded into q's store through an impossible compare."""
    HALF: tl.constexpr = D // 2
    toks = tl.program_id(0) * TOK + tl.arange(0, TOK)
    tmask = toks < T
    t64 = toks.to(tl.int64)
    d = tl.arange(0, HALF_P)
    dmask = d < HALF
    pos = tl.load(POS + toks, mask=tmask, other=0).to(tl.int64)
    slot = tl.load(SLOTS + toks, mask=tmask, other=-1)
    cs_row = CS + pos[:, None] * stride_cs + d[None, :]
    cmask = tmask[:, None] & dmask[None, :]
    cs = tl.sum(tl.load(cs_row, mask=cmask, other=0.0) + tl.load(cs_row + HALF, mask=cmask, other=0.0), 1)
    never = (cs == 1.0e30)[:, None, None]                        # keeps the cos/sin loads alive
    row = QKV + t64[:, None, None] * stride_t + d[None, None, :]
    hq = tl.arange(0, HQ_P)
    qmask = tmask[:, None, None] & (hq < HQ)[None, :, None] & dmask[None, None, :]
    q_ptr = row + (hq * D)[None, :, None]
    q1 = tl.load(q_ptr, mask=qmask, other=0.0)
    q2 = tl.load(q_ptr + HALF, mask=qmask, other=0.0)
    out = QO + t64[:, None, None] * stride_qt + (hq * D)[None, :, None] + d[None, None, :]
    tl.store(out, tl.where(never, 0.0, q1).to(q1.dtype), mask=qmask)
    tl.store(out + HALF, q2, mask=qmask)
    valid = slot >= 0
    slot64 = tl.where(valid, slot, 0).to(tl.int64)
    page = slot64 // PAGE
    off = slot64 % PAGE
    hk = tl.arange(0, HKV_P)
    kmask = tmask[:, None, None] & (hk < HKV)[None, :, None] & dmask[None, None, :]
    smask = kmask & valid[:, None, None]
    k_ptr = row + ((HQ + hk) * D)[None, :, None]
    v_ptr = row + ((HQ + HKV + hk) * D)[None, :, None]
    k1 = tl.load(k_ptr, mask=kmask, other=0.0)
    k2 = tl.load(k_ptr + HALF, mask=kmask, other=0.0)
    v1 = tl.load(v_ptr, mask=kmask, other=0.0)
    v2 = tl.load(v_ptr + HALF, mask=kmask, other=0.0)
    head_off = (hk * D)[None, :, None] + d[None, None, :]
    kdst = KC + (page * stride_kcp + off * stride_kcs)[:, None, None] + head_off
    tl.store(kdst, k1, mask=smask)
    tl.store(kdst + HALF, k2, mask=smask)
    vdst = VC + (page * stride_vcp + off * stride_vcs)[:, None, None] + head_off
    tl.store(vdst, v1, mask=smask)
    tl.store(vdst + HALF, v2, mask=smask)


@triton.jit
def _ar_load(p_ptr, offs, mask):
    return tl.load(p_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)


@triton.jit
def _ar_rows(p0, p1, p2, p3, p4, p5, p6, p7, r_ptr, w_ptr, y_ptr, y8_ptr, s_ptr, T, H, eps,
             R: tl.constexpr, QUANT: tl.constexpr, GS: tl.constexpr, NG: tl.constexpr, ROWS: tl.constexpr,
             ARITH: tl.constexpr):
    """Grid (cdiv(T, ROWS),): the allreduce expert's traffic ([ROWS, NG, GS] blocks, R partials
    through R pointer arguments in rank order, evict-first; the residual read and written; y and
    the group scales written) with ARITH levels of its arithmetic: 0 the rank sum and residual
    add only (y: the low byte of z * w for FP8, z * w for a bf16 y; zero scales), 1 + the RMSNorm
    (rstd, y = z rstd w; FP8 y still a low byte), 2 + the quantiser as the expert does it (group
    amax, correctly rounded scale, y / s, clamp, FP8 cast), 3 the quantiser with y * (1 / s)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    grp = tl.arange(0, NG)
    G = H // GS
    m2 = (rows < T)[:, None] & (grp < G)[None, :]
    m3 = m2[:, :, None]
    col = grp[None, :, None] * GS + tl.arange(0, GS)[None, None, :]
    offs = rows.to(tl.int64)[:, None, None] * H + col
    acc = _ar_load(p0, offs, m3)
    if R > 1:
        acc += _ar_load(p1, offs, m3)
    if R > 2:
        acc += _ar_load(p2, offs, m3)
    if R > 3:
        acc += _ar_load(p3, offs, m3)
    if R > 4:
        acc += _ar_load(p4, offs, m3)
    if R > 5:
        acc += _ar_load(p5, offs, m3)
    if R > 6:
        acc += _ar_load(p6, offs, m3)
    if R > 7:
        acc += _ar_load(p7, offs, m3)
    dt = r_ptr.dtype.element_ty
    res = tl.load(r_ptr + offs, mask=m3, other=0.0)
    z = (acc + res.to(tl.float32)).to(dt)
    tl.store(r_ptr + offs, z, mask=m3)
    zf = z.to(tl.float32)
    w = tl.load(w_ptr + col, mask=(grp < G)[None, :, None], other=0.0).to(tl.float32)
    if ARITH == 0:
        y = zf * w
    else:
        rstd = tl.rsqrt(tl.sum(tl.sum(zf * zf, axis=2), axis=1) / H + eps)
        y = (zf * rstd[:, None, None]) * w
    if QUANT and ARITH >= 2:
        s = tl.div_rn(tl.maximum(tl.max(tl.abs(y), axis=2), 1e-10), 448.0)
        if ARITH == 2:
            q = tl.minimum(tl.maximum(y / s[:, :, None], -448.0), 448.0)
        else:
            q = tl.minimum(tl.maximum(y * (1.0 / s)[:, :, None], -448.0), 448.0)
        tl.store(y_ptr + offs, q.to(y_ptr.dtype.element_ty), mask=m3)
        tl.store(s_ptr + rows.to(tl.int64)[:, None] * G + grp[None, :], s, mask=m2)
    elif QUANT:
        low = (y.to(tl.int32, bitcast=True) >> 24).to(tl.int8)              # a byte per element, no cvt
        tl.store(y8_ptr + offs, low, mask=m3)
        tl.store(s_ptr + rows.to(tl.int64)[:, None] * G + grp[None, :], tl.zeros([ROWS, NG], tl.float32), mask=m2)
    else:
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=m3)


@triton.jit
def _flat_copy(SRC, DST, n_read, n_write, per_prog, BLOCK: tl.constexpr):
    """Program p reads SRC[p * per_prog, +per_prog) below n_read and writes what it read to the
    same DST elements below n_write (BLOCK-element tiles): a contiguous copy of n_read + n_write
    elements' bytes."""
    lo = tl.program_id(0).to(tl.int64) * per_prog
    offs = tl.arange(0, BLOCK)
    for s in range(0, per_prog, BLOCK):
        idx = lo + s + offs
        inside = s + offs < per_prog
        x = tl.load(SRC + idx, mask=inside & (idx < n_read), other=0.0)
        tl.store(DST + idx, x, mask=inside & (idx < n_write))


@triton.jit
def _topk_read(X, T, K, P, U, IDS, SINK, V, stride_row, S, TILE: tl.constexpr, NT: tl.constexpr):
    """Grid (B, S): program (row, split) reads the split's NT tiles of TILE logits of its row
    (the sampler expert's chunking; S = 1 with NT = cdiv(V, TILE): one program per row) into a
    sum; the row's last split reads the four parameters and writes the row's int64 id."""
    row = tl.program_id(0).to(tl.int64)
    sp = tl.program_id(1)
    offs = tl.arange(0, TILE)
    start = sp * (NT * TILE)
    end = tl.minimum(start + NT * TILE, V)
    acc = tl.zeros([TILE], dtype=tl.float32)
    for t in range(NT):
        idx = start + t * TILE + offs
        acc += tl.load(X + row * stride_row + idx, mask=idx < end, other=0.0)
    total = tl.sum(acc, 0)
    _sink(SINK, row * S + sp, total)
    if sp == S - 1:
        par = tl.load(T + row) + tl.load(P + row) + tl.load(U + row) + tl.load(K + row).to(tl.float32)
        tl.store(IDS + row, (par == 1.0e30).to(tl.int64))


@triton.jit
def _topk_split_pass(X, T, CX, CI, STAT, CNT, V, stride_row, c_sigma, S_PAD: tl.constexpr, CAP: tl.constexpr,
                     TILE: tl.constexpr, NT: tl.constexpr, PREFETCH: tl.constexpr):
    """Grid (B, S): the sampler expert's split pass as a kernel of its own (no finaliser code in
    the same kernel, so its registers and occupancy are the pass's own): the candidate threshold
    from one tile (moments, then the moments with the head clipped at 3 sigma), one pass over the
    chunk (online max and exp2 denominator, candidates compacted in vocabulary order), the
    chunk's statistics and count stored (the expert's scratch layout). ``PREFETCH``: the next
    tile's load is issued before the current tile's reductions (one tile in flight during them)."""
    row = tl.program_id(0).to(tl.int64)
    sp = tl.program_id(1)
    row_ptr = X + row * stride_row
    s2 = 1.4426950408889634 / tl.load(T + row)
    offs = tl.arange(0, TILE)
    start = sp * (NT * TILE)
    end = tl.minimum(start + NT * TILE, V)
    est = tl.maximum(tl.minimum(start, V - TILE), 0)
    x0 = tl.load(row_ptr + est + offs, mask=est + offs < V, other=float("-inf"))
    f0 = x0 > float("-inf")
    y0 = tl.where(f0, x0, 0.0)
    n0 = tl.maximum(tl.sum(f0.to(tl.float32), axis=0), 1.0)
    mu0 = tl.sum(y0, axis=0) / n0
    sd0 = tl.sqrt(tl.maximum(tl.sum(y0 * y0, axis=0) / n0 - mu0 * mu0, 0.0))
    f1 = f0 & (x0 <= mu0 + 3.0 * sd0)
    y1 = tl.where(f1, x0, 0.0)
    n1 = tl.sum(f1.to(tl.float32), axis=0)
    mu = tl.sum(y1, axis=0) / tl.maximum(n1, 1.0)
    sd = tl.sqrt(tl.maximum(tl.sum(y1 * y1, axis=0) / tl.maximum(n1, 1.0) - mu * mu, 0.0))
    tau = tl.where(n1 >= 16.0, mu + c_sigma * sd, float("-inf"))
    m_run = s2 * 0.0 - float("inf")
    z_run = s2 * 0.0
    cnt = sp * 0
    cbase = (row * S_PAD + sp) * CAP
    x_next = tl.full([TILE], float("-inf"), tl.float32)
    if PREFETCH:
        x_next = tl.load(row_ptr + start + offs, mask=start + offs < end, other=float("-inf"))
    for t in range(NT):
        idx = start + t * TILE + offs
        inb = idx < end
        if PREFETCH:
            x = x_next
            x_next = tl.load(row_ptr + idx + TILE, mask=idx + TILE < end, other=float("-inf"))
        else:
            x = tl.load(row_ptr + idx, mask=inb, other=float("-inf"))
        m_new = tl.maximum(m_run, tl.max(x, axis=0))
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)
        z_run = z_run * tl.exp2((m_run - m_safe) * s2) + tl.sum(tl.exp2((x - m_safe) * s2), axis=0)
        m_run = m_new
        sel = inb & (x >= tau) & (x > float("-inf"))
        nsel = tl.sum(sel.to(tl.int32), axis=0)
        if nsel > 0:
            pos = cnt + tl.cumsum(sel.to(tl.int32), axis=0) - 1
            ok = sel & (pos < CAP)
            tl.store(CX + cbase + pos, x, mask=ok)
            tl.store(CI + cbase + pos, idx, mask=ok)
        cnt += nsel
    sbase = (row * S_PAD + sp) * 3
    tl.store(STAT + sbase, m_run)
    tl.store(STAT + sbase + 1, z_run)
    tl.store(STAT + sbase + 2, tau)
    tl.store(CNT + row * S_PAD + sp, cnt)


#: The w4a16 expert's own unpacking and store helpers (``_field_w16``, ``_pair_w16_asm``,
#: ``_store_mma_field``), which ``_w4_fields`` calls under these names: bound by :func:`_bind_w4`
#: before its first launch, so the skeleton's levels run the expert's code, not a copy of it.
_w4_field = _w4_pair_asm = _w4_store_cols = None


def _bind_w4(expert) -> None:
    """Bind the helper names ``_w4_fields`` calls to the w4a16 expert's Triton functions, once per
    process: Triton refuses to run a kernel whose globals changed after it compiled, and every
    loaded copy of the expert holds the same code."""
    global _w4_field, _w4_pair_asm, _w4_store_cols
    if _w4_field is None:
        _w4_field, _w4_pair_asm, _w4_store_cols = expert._field_w16, expert._pair_w16_asm, expert._store_mma_field


@triton.jit
def _w4_fields(x_ptr, qw_ptr, qz_ptr, s16_ptr, s32_ptr, y_ptr, SINK, M, N, K, stride_xm, stride_qk, stride_zg,
               stride_s16, stride_s32, G: tl.constexpr, BM: tl.constexpr, BP: tl.constexpr, BK: tl.constexpr,
               SPLIT_K: tl.constexpr, ASM: tl.constexpr, DEQ: tl.constexpr):
    """Grid (cdiv(N / 8, BP), SPLIT_K, cdiv(M, BM)): the w4a16 expert's ``_awq_fields_mma``
    traffic (per K step of BK rows: the [BM, BK] x tile, the [BK, BP] packed words evict-first,
    the group's BP zero-point words and 8 BP scales) at DEQ levels of its arithmetic:
    0 no unpacking (the words xor-folded to 16 bits, masked to a finite fp16 < 2: 3 integer ops
    per word, 3/8 per weight) and one MMA x @ fold per step (1/8 of the expert's MMA work), the
    zero points and scales xor-reduced; 1 the expert's unpacking of all 8 fields (ASM: its paired
    inline PTX; else its Triton ops) summed (7 fp16 adds) into one MMA per step; 2 the expert's
    unpacking and its 8 MMAs into 8 accumulators. Split 0 writes y (M x N fp16, no partial
    workspace, no reduction pass); every program reduces its accumulators into the sink."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    steps = K // BK
    per = tl.cdiv(steps, SPLIT_K)
    k0 = pid_k * per * BK
    k1 = min(k0 + per * BK, K)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_p = pid_n * BP + tl.arange(0, BP)
    offs_k = tl.arange(0, BK)
    m_ok = offs_m < M
    p_ok = offs_p < N // 8
    x_ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = qw_ptr + offs_k.to(tl.int64)[:, None] * stride_qk + offs_p[None, :]
    acc = tl.zeros((BM, BP), dtype=tl.float32)
    meta = tl.zeros((BP,), dtype=tl.int32)
    if DEQ == 2:
        a1 = tl.zeros((BM, BP), dtype=tl.float32)
        a2 = tl.zeros((BM, BP), dtype=tl.float32)
        a3 = tl.zeros((BM, BP), dtype=tl.float32)
        a4 = tl.zeros((BM, BP), dtype=tl.float32)
        a5 = tl.zeros((BM, BP), dtype=tl.float32)
        a6 = tl.zeros((BM, BP), dtype=tl.float32)
        a7 = tl.zeros((BM, BP), dtype=tl.float32)
    for k in range(k0, k1, BK):
        g = k // G
        x = tl.load(x_ptrs + k, mask=m_ok[:, None], other=0.0)
        words = tl.load(w_ptrs + k * stride_qk, mask=p_ok[None, :], other=0, eviction_policy="evict_first")
        zw = tl.load(qz_ptr + g * stride_zg + offs_p, mask=p_ok, other=0)
        if DEQ == 0:
            s32_row = s32_ptr + g * stride_s32 + offs_p * 4          # the 8 scales as 4 int32 pairs
            meta ^= zw ^ tl.load(s32_row, mask=p_ok, other=0) ^ tl.load(s32_row + 1, mask=p_ok, other=0)
            meta ^= tl.load(s32_row + 2, mask=p_ok, other=0) ^ tl.load(s32_row + 3, mask=p_ok, other=0)
            fold = ((words ^ (words >> 16)) & 0x3FFF).to(tl.int16).to(tl.float16, bitcast=True)
            acc = tl.dot(x, fold, acc)
        else:
            if ASM:
                s32_row = s32_ptr + g * stride_s32 + offs_p * 4
                w0, w4 = _w4_pair_asm(words, zw, s32_row, p_ok, 0)
                w1, w5 = _w4_pair_asm(words, zw, s32_row, p_ok, 1)
                w2, w6 = _w4_pair_asm(words, zw, s32_row, p_ok, 2)
                w3, w7 = _w4_pair_asm(words, zw, s32_row, p_ok, 3)
            else:
                s_row = s16_ptr + g * stride_s16 + offs_p * 8
                w0 = _w4_field(words, zw, s_row, p_ok, 0, 0)         # field i holds column AWQ_ORDER[i]
                w1 = _w4_field(words, zw, s_row, p_ok, 4, 2)
                w2 = _w4_field(words, zw, s_row, p_ok, 8, 4)
                w3 = _w4_field(words, zw, s_row, p_ok, 12, 6)
                w4 = _w4_field(words, zw, s_row, p_ok, 16, 1)
                w5 = _w4_field(words, zw, s_row, p_ok, 20, 3)
                w6 = _w4_field(words, zw, s_row, p_ok, 24, 5)
                w7 = _w4_field(words, zw, s_row, p_ok, 28, 7)
            if DEQ == 1:
                acc = tl.dot(x, ((w0 + w4) + (w1 + w5)) + ((w2 + w6) + (w3 + w7)), acc)
            else:
                acc = tl.dot(x, w0, acc)
                a1 = tl.dot(x, w1, a1)
                a2 = tl.dot(x, w2, a2)
                a3 = tl.dot(x, w3, a3)
                a4 = tl.dot(x, w4, a4)
                a5 = tl.dot(x, w5, a5)
                a6 = tl.dot(x, w6, a6)
                a7 = tl.dot(x, w7, a7)
    total = tl.sum(tl.sum(acc, 1), 0) + tl.sum(meta, 0).to(tl.float32)
    ok = m_ok[:, None] & p_ok[None, :] & (pid_k == 0)
    if DEQ == 2:
        total += tl.sum(tl.sum(((a1 + a2) + (a3 + a4)) + ((a5 + a6) + a7), 1), 0)
        _w4_store_cols(y_ptr, N, acc, offs_m, offs_p, ok, 0)
        _w4_store_cols(y_ptr, N, a1, offs_m, offs_p, ok, 2)
        _w4_store_cols(y_ptr, N, a2, offs_m, offs_p, ok, 4)
        _w4_store_cols(y_ptr, N, a3, offs_m, offs_p, ok, 6)
        _w4_store_cols(y_ptr, N, a4, offs_m, offs_p, ok, 1)
        _w4_store_cols(y_ptr, N, a5, offs_m, offs_p, ok, 3)
        _w4_store_cols(y_ptr, N, a6, offs_m, offs_p, ok, 5)
        _w4_store_cols(y_ptr, N, a7, offs_m, offs_p, ok, 7)
    else:
        for c in tl.static_range(8):
            _w4_store_cols(y_ptr, N, acc, offs_m, offs_p, ok, c)
    _sink(SINK, (pid_m * SPLIT_K + pid_k) * tl.num_programs(0) + pid_n, total)


# ----------------------------------------------------------------------------------------------
# launches (host code reads no tensor values: CUDA-graph capturable, compile-only on empty tensors)
# ----------------------------------------------------------------------------------------------

def _sink_buf(n: int, device) -> torch.Tensor:
    return torch.zeros(max(1, n), dtype=torch.float32, device=device)


def _tuned(kernel, default: dict) -> dict:
    """The autotuned kernel's chosen config (``best_config`` after a call on this GPU) as
    ``{meta..., num_warps, num_stages}``, else ``default``."""
    cfg = getattr(kernel, "best_config", None)
    if cfg is None or _INTERPRET:
        return dict(default)
    return {**cfg.kwargs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}


def mla_skeleton(expert, args: list, sms: int) -> tuple[str, Callable[[], None]]:
    """The mla read skeleton of one input set: ``(description, call)``."""
    q_nope, q_pe, kv, bt, sl, w_uk, w_uv, _scale = args
    B, H, DN = q_nope.shape
    DR = q_pe.shape[2]
    _, PS, _ = kv.shape
    DL, DV = w_uv.shape[1], w_uv.shape[2]
    nw = expert.workers(H, sms)
    if _INTERPRET:   # small CPU test workloads: 16-row head blocks (two blocks from H = 17 on)
        cfg = {"BLOCK_H": 16, "BLOCK_N": 16, "num_warps": 1, "num_stages": 1}
    else:
        cfg = _tuned(expert._latent_kernel, {"BLOCK_H": 16 if H <= 16 else 64, "BLOCK_N": 32 if H <= 16 else 64,
                                             "num_warps": 4 if H <= 16 else 8, "num_stages": 3 if H <= 16 else 2})
    bh, bn = cfg["BLOCK_H"], cfg["BLOCK_N"]
    bp2 = max(16, triton.next_power_of_2(B))
    o = torch.empty((B, H, DV), device=q_nope.device, dtype=q_nope.dtype)
    sink = _sink_buf(triton.cdiv(H, bh) * nw, q_nope.device)
    bk = min(DL, 64)

    def call():
        _mla_latent_read[(triton.cdiv(H, bh), nw)](
            q_pe, kv, bt, sl, sink, B, H, nw, q_pe.stride(0), q_pe.stride(1), kv.stride(0), kv.stride(1), bt.stride(0),
            DL=DL, DR=DR, PAGE=PS, BP2=bp2, BLOCK_H=bh, BLOCK_N=bn, num_warps=cfg["num_warps"],
            num_stages=cfg["num_stages"])
        _mla_heads_rw[(H,)](q_nope, w_uk, w_uv, o, B, q_nope.stride(0), q_nope.stride(1), o.stride(0), o.stride(1),
                            DN=DN, DL=DL, DV=DV, BP2=bp2, BK=bk, num_warps=4)
        return o

    call.outputs = {"o": o}  # type: ignore[attr-defined]
    what = (f"latent reads: grid ({triton.cdiv(H, bh)} head blocks x {nw} workers), BLOCK_H {bh}, "
            f"[{bn} x {DL}+{DR}] tiles, {cfg['num_warps']} warps, {cfg['num_stages']} stages; + {H} head programs "
            "(weights, q_nope, o)")
    return what, call


def mla_compute(expert, args: list, sms: int, softmax: bool) -> tuple[str, Callable[[], None], float]:
    """The mla compute skeleton: ``(description, call, MMA FLOPs per call)``; reads ``seq_lens``
    once on the host (setup) for the tiles per program."""
    q_nope, q_pe, kv, bt, sl, w_uk, w_uv, scale = args
    B, H, _ = q_nope.shape
    DR = q_pe.shape[2]
    _, PS, _ = kv.shape
    DL = w_uv.shape[1]
    nw = expert.workers(H, sms)
    cfg = _tuned(expert._latent_kernel, {"BLOCK_H": 16 if H <= 16 else 64, "BLOCK_N": 32 if H <= 16 else 64,
                                         "num_warps": 4 if H <= 16 else 8, "num_stages": 3 if H <= 16 else 2})
    if _INTERPRET:
        cfg = {"BLOCK_H": 16, "BLOCK_N": 16, "num_warps": 1, "num_stages": 1}
    bh, bn = cfg["BLOCK_H"], cfg["BLOCK_N"]
    pages = sum(-(-int(x) // PS) for x in sl.tolist()) if sl.device.type != "meta" else 0
    tiles = triton.cdiv(pages, nw) * (PS // bn)
    ntiles = 16
    dev = q_nope.device
    c = (torch.randn((ntiles * bn, DL + DR), device="cpu") * 0.1).to(kv.dtype).to(dev)
    ql = (torch.randn((bh, DL), device="cpu") * 0.1).to(kv.dtype).to(dev)
    qp = (torch.randn((bh, DR), device="cpu") * 0.1).to(kv.dtype).to(dev)
    grid = (triton.cdiv(H, bh), nw)
    sink = _sink_buf(grid[0] * grid[1], dev)
    flops = 2.0 * grid[0] * nw * tiles * bh * bn * (2 * DL + DR)

    def call():
        _mla_mma[grid](c, ql, qp, sink, tiles, scale * 1.4426950408889634, DL=DL, DR=DR, BLOCK_H=bh, BLOCK_N=bn,
                       TILES=ntiles, SOFTMAX=softmax, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])

    what = (f"{'MMAs + online softmax' if softmax else 'MMAs only'}: grid {grid}, BLOCK_H {bh}, BLOCK_N {bn}, "
            f"{tiles} tiles per program on {ntiles} L2-resident tiles, {cfg['num_warps']} warps")
    return what, call, flops


def cascade_skeleton(expert, args: list, sms: int, split_prefix: bool = False) -> tuple[str, Callable[[], None]]:
    """The cascade read skeleton of one input set: ``(description, call)``."""
    q, k_cache, v_cache, bts, sl, prefix_len, _scale = args
    N, Hq, D = q.shape
    _, BS, Hkv, _ = k_cache.shape
    P = int(prefix_len) // BS * BS
    group = Hq // Hkv
    npc, pc, nsc, sc = expert.plan(N, Hq, Hkv, P, bts.shape[1] * BS - P, sms)
    row_tiles = triton.cdiv(N * group, expert.BLOCK_M)
    cfg = _tuned(expert._cascade_kernel, {"BLOCK_N": 16, "num_warps": 1, "num_stages": 1} if _INTERPRET
                 else {"BLOCK_N": 64, "num_warps": 4, "num_stages": 2})
    grid = (Hkv * npc * row_tiles + N * Hkv * nsc,)
    o = torch.empty_like(q)
    sink = _sink_buf(grid[0], q.device)

    def call():
        _cascade_read[grid](
            q, k_cache, v_cache, bts, sl, o, sink, P, N, pc, sc,
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), bts.stride(0), o.stride(0), o.stride(1),
            HKV=Hkv, GROUP=group, QROWS=max(16, triton.next_power_of_2(group)), HEAD_DIM=D, PAGE=BS,
            ROW_TILES=row_tiles, NPC=npc, NSC=nsc, BLOCK_M=expert.BLOCK_M, BLOCK_N=cfg["BLOCK_N"],
            SPLIT_PREFIX=split_prefix, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
        return o

    call.outputs = {"o": o}  # type: ignore[attr-defined]
    what = (f"{Hkv * npc * row_tiles} prefix programs ({Hkv} KV x {npc} chunks of {pc} x {row_tiles} row tiles"
            f"{', split' if split_prefix else ''}) + {N * Hkv * nsc} suffix programs ({nsc} chunks of {sc}), "
            f"BLOCK_N {cfg['BLOCK_N']}, {cfg['num_warps']} warps, {cfg['num_stages']} stages")
    return what, call


def cascade_prefix_compute(expert, args: list, sms: int) -> tuple[str, Callable[[], None], float]:
    """The cascade prefix programs' MMAs and online softmax on L2-resident tiles (the expert's
    prefix grid, row tile and chunk sizes): ``(description, call, MMA FLOPs per call)``."""
    q, k_cache, _v, bts, _sl, prefix_len, scale = args
    N, Hq, D = q.shape
    _, BS, Hkv, _ = k_cache.shape
    P = int(prefix_len) // BS * BS
    group = Hq // Hkv
    npc, pc, _nsc, _sc = expert.plan(N, Hq, Hkv, P, bts.shape[1] * BS - P, sms)
    row_tiles = triton.cdiv(N * group, expert.BLOCK_M)
    cfg = _tuned(expert._cascade_kernel, {"BLOCK_N": 16, "num_warps": 1, "num_stages": 1} if _INTERPRET
                 else {"BLOCK_N": 64, "num_warps": 4, "num_stages": 2})
    bn, bm, ntiles = cfg["BLOCK_N"], expert.BLOCK_M, 16
    dev = q.device
    kv = (torch.randn((2 * ntiles * bn, D), device="cpu") * 0.1).to(q.dtype).to(dev)
    qt = (torch.randn((bm, D), device="cpu") * 0.1).to(q.dtype).to(dev)
    grid = (Hkv * npc * row_tiles,)
    sink = _sink_buf(grid[0], dev)
    tokens = sum(min(pc, P - c * pc) for c in range(npc)) * Hkv * row_tiles
    flops = 4.0 * bm * D * tokens

    def call():
        if grid[0]:
            _cascade_prefix_mma[grid](kv, qt, sink, P, pc, scale * 1.4426950408889634, HEAD_DIM=D, ROW_TILES=row_tiles,
                                      NPC=max(1, npc), BLOCK_M=bm, BLOCK_N=bn, TILES=ntiles,
                                      num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])

    what = (f"prefix programs only, on L2-resident K/V: {grid[0]} programs ({Hkv} KV x {npc} chunks of {pc} x "
            f"{row_tiles} row tiles of {bm}), BLOCK_N {bn}: Q K^T, online softmax, P V")
    return what, call, flops


def lora_skeleton(expert, args: list, sms: int) -> tuple[str, Callable[[], None]]:
    """The lora skeleton of one input set (sort, shrink reads, expand read-modify-write)."""
    x, y, lora_a, lora_b, offs, mapping, _scale = args
    T, K = x.shape
    S, L, R, _ = lora_a.shape
    N = y.shape[1]
    cfg = expert.config_for(T, K, N, R, L, S, sms)
    dev = x.device
    SR = S * R
    LP = max(16, triton.next_power_of_2(L))
    C = triton.cdiv(T, expert.CHUNK)
    sorted_ids = torch.empty(T, dtype=torch.int32, device=dev)
    counts = torch.empty(LP, dtype=torch.int32, device=dev)
    dummy = torch.empty(1, dtype=torch.float32, device=dev)
    hist = torch.empty((C, LP), dtype=torch.int32, device=dev) if C > 1 else counts
    meta = dict(CH=expert.CHUNK, LP=LP, CP=max(2, triton.next_power_of_2(C)), BC=min(128, triton.next_power_of_2(SR)),
                ZR=expert.ZERO_ROWS, ZERO=False, num_warps=4)
    gargs = (mapping, hist, sorted_ids, counts, dummy, T, L, C, SR)
    max_tiles = triton.cdiv(T, cfg.bm) + L
    k_per_split = triton.cdiv(triton.cdiv(K, cfg.split), cfg.bk) * cfg.bk
    sgrid = (max_tiles, triton.cdiv(K, k_per_split))
    egrid = (max_tiles, triton.cdiv(N, cfg.bn))
    sink = _sink_buf(sgrid[0] * sgrid[1], dev)

    def call():
        if C == 1:
            expert._group_kernel[(1,)](*gargs, PHASE=0, **meta)
        else:
            expert._group_kernel[(C,)](*gargs, PHASE=1, **meta)
            expert._group_kernel[(C,)](*gargs, PHASE=2, **meta)
        _lora_shrink_read[sgrid](x, lora_a, sorted_ids, counts, sink, L, K, k_per_split, SR, x.stride(0),
                                 lora_a.stride(0), lora_a.stride(1), lora_a.stride(2), R=R,
                                 SRP=max(16, triton.next_power_of_2(SR)), BM=cfg.bm, BK=cfg.bk, LP=LP,
                                 num_warps=cfg.warps_s, num_stages=cfg.stages_s)
        _lora_expand_rmw[egrid](lora_b, y, sorted_ids, counts, offs, L, N, S, lora_b.stride(0), lora_b.stride(1),
                                y.stride(0), R=R, BM=cfg.bm, BN=cfg.bn, LP=LP,
                                SP=max(2, triton.next_power_of_2(S)), num_warps=cfg.warps_e, num_stages=cfg.stages_e)

    what = (f"sort ({C} chunks) + shrink grid {sgrid} ([{cfg.bm} x {cfg.bk}] x tiles, split {cfg.split}) + expand "
            f"grid {egrid} ([{cfg.bm} x {cfg.bn}] y tiles)")
    return what, call


def qkv_skeleton(expert, args: list, sms: int) -> tuple[str, Callable[[], None]]:
    """The fused_qkv_norm_rope_cache copy skeleton of one input set: the expert's grid, tokens
    per program and warps (its ``plan``), q / k / v rows copied without the norm and the rotation."""
    qkv, _qw, _kw, cs, pos, kc, vc, slots, hq, _eps = args
    T = qkv.shape[0]
    _, BS, Hkv, D = kc.shape
    Hq = int(hq)
    tok, warps = expert.plan(T, Hq, Hkv, D)
    q_out = torch.empty((T, Hq, D), dtype=qkv.dtype, device=qkv.device)
    grid = (triton.cdiv(T, tok),)

    def call():
        _qkv_rows[grid](qkv, cs, pos, kc, vc, slots, q_out, T, qkv.stride(0), cs.stride(0), q_out.stride(0),
                        kc.stride(0), kc.stride(1), vc.stride(0), vc.stride(1), HQ=Hq, HKV=Hkv, D=D, PAGE=BS,
                        TOK=tok, HQ_P=triton.next_power_of_2(Hq), HKV_P=triton.next_power_of_2(Hkv),
                        HALF_P=triton.next_power_of_2(D // 2), num_warps=warps)
        return q_out

    call.outputs = {"q_out": q_out}  # type: ignore[attr-defined]
    what = (f"grid ({grid[0]},): {tok} token(s) x {Hq}+{2 * Hkv} heads per program as [tok, heads, {D // 2}] "
            f"half tiles, {warps} warps; q copied out, k / v copied to the slot, cos|sin row read")
    return what, call


#: Arithmetic levels of the allreduce skeleton (``_ar_rows`` ARITH): row kind and description.
AR_LEVELS = {0: ("skeleton", "rank sum + residual add only (FP8 y: a low byte, no cvt; zero scales)"),
             1: ("skeleton_norm", "+ RMSNorm (FP8 y still a low byte, zero scales)"),
             2: ("skeleton_quant", "+ the expert's quantiser: group amax, div_rn scale, y / s, clamp, FP8 cvt"),
             3: ("skeleton_quant_rcp", "the quantiser with y * (1 / s) (one reciprocal per group)")}


def allreduce_skeleton(expert, args: list, sms: int, arith: int = 0) -> tuple[str, Callable[[], None]]:
    """The allreduce_residual_rmsnorm skeleton of one input set at arithmetic level ``arith``
    (:data:`AR_LEVELS`): the expert's grid, [rows, groups, 128] blocks and warps (its ``_tile``).
    The residual is updated in place (each call adds the partials again: values grow, bytes do
    not change)."""
    partials, residual, weight, eps, gs, quant = args
    R = len(partials)
    T, H = residual.shape
    ng, rows, warps = expert._tile(H, gs)
    G = H // gs
    ydtype = torch.float8_e4m3fn if quant and residual.dtype == torch.bfloat16 else residual.dtype
    y = torch.empty((T, H), dtype=ydtype, device=residual.device)
    s = torch.empty((T, G if quant else 0), dtype=torch.float32, device=residual.device)
    y8 = y.view(torch.int8) if y.element_size() == 1 else y.view(torch.int16)
    ptrs = list(partials) + [partials[0]] * (8 - R)
    grid = (triton.cdiv(T, rows),)

    def call():
        _ar_rows[grid](*ptrs, residual, weight, y, y8, s if quant else y, T, H, eps, R=R, QUANT=bool(quant),
                       GS=gs, NG=ng, ROWS=rows, ARITH=arith, num_warps=warps)
        return y, s

    call.outputs = {"y": y, "y_s": s}  # type: ignore[attr-defined]
    what = (f"grid ({grid[0]},): [{rows} x {ng} x {gs}] blocks ({G} groups used), {warps} warps, {R} partials "
            f"by pointer; {AR_LEVELS[arith][1]}")
    return what, call


def sol_split(task_id: str, axes: dict) -> tuple[float, float]:
    """(read, written) bytes of the floor SOL model where the copy rows need them (the task.yaml
    formulas split by direction; tested against :func:`count_bytes`); other tasks: all read.

    Raises:
        KeyError: a task without a split (use the plain SOL bytes).
    """
    a = {k: int(v) for k, v in axes.items()}
    if task_id == "fused_qkv_norm_rope_cache":
        T, Hq, Hkv, D = a["T"], a["Hq"], a["Hkv"], a["D"]
        written = 2 * T * Hq * D + 4 * (T - T // 50) * Hkv * D
        read = 2 * T * (Hq + 2 * Hkv) * D + 4 * T * D + 16 * T
        return float(read), float(written)
    if task_id == "allreduce_residual_rmsnorm":
        R, T, H, GS, Q = a["R"], a["T"], a["H"], a["GS"], a["Q"]
        read = 2 * R * T * H + 2 * T * H + 2 * H
        written = 2 * T * H + (1 - Q) * 2 * T * H + Q * (T * H + 4 * T * (H // GS))
        return float(read), float(written)
    raise KeyError(task_id)


def flat_copier(read_bytes: int, write_bytes: int, device, programs: int, n_sets: int, block: int = 4096,
                warps: int = 4) -> Callable[[int], None]:
    """``call(i)``: :func:`_flat_copy` of segment ``i`` of ``n_sets`` rotating source and
    destination buffers (bf16 elements, bytes rounded up to 2): ``programs`` programs of
    ``block``-element tiles, ``read_bytes`` read and ``write_bytes`` written."""
    nr, nw = (read_bytes + 1) // 2, (write_bytes + 1) // 2
    n = max(nr, nw)
    src = torch.zeros(n * n_sets, dtype=torch.bfloat16, device=device)
    dst = torch.empty(n * n_sets, dtype=torch.bfloat16, device=device)
    per_prog = triton.cdiv(triton.cdiv(n, programs), block) * block
    grid = (triton.cdiv(n, per_prog),)

    def call(i: int):
        _flat_copy[grid](src[i * n:(i + 1) * n], dst[i * n:(i + 1) * n], nr, nw, per_prog, BLOCK=block,
                         num_warps=warps)

    call.buffers = {"src": src, "dst": dst}  # type: ignore[attr-defined]
    return call


def torch_copier(nbytes: int, device, n_sets: int) -> Callable[[int], None]:
    """``call(i)``: PyTorch's device-to-device ``copy_`` of ``nbytes / 2`` bytes (``nbytes`` moved,
    the measured HBM ceiling's own method) on segment ``i`` of ``n_sets`` rotating buffers."""
    n = max(1, nbytes // 4)
    src = torch.zeros(n * n_sets, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)

    def call(i: int):
        dst[i * n:(i + 1) * n].copy_(src[i * n:(i + 1) * n])
    return call


def topk_skeleton(expert, args: list, sms: int, row_program: bool = False) -> tuple[str, Callable[[], None]]:
    """The sampler's read skeleton of one input set: the logits once and the four parameters,
    one id written per row, no arithmetic. Default: the expert's grid (rows x splits of NT tiles
    of TILE logits, its warps; ``expert._config``). ``row_program``: one program per row reads
    its V logits (the grid of a one-program-per-row sampler: B programs on the SMs)."""
    logits, temp, top_k, top_p, u = args
    B, V = logits.shape
    cfg = expert._config(B, V)
    tile = cfg["TILE"]
    s, nt = (1, triton.cdiv(V, tile)) if row_program else (cfg["S"], cfg["NT"])
    ids = torch.empty(B, dtype=torch.int64, device=logits.device)
    sink = _sink_buf(B * s, logits.device)

    def call():
        _topk_read[(B, s)](logits, temp, top_k, top_p, u, ids, sink, V, logits.stride(0), s, TILE=tile, NT=nt,
                           num_warps=cfg["num_warps"])
        return ids

    call.outputs = {"ids": ids}  # type: ignore[attr-defined]
    what = (f"one program per row ({B} programs), [{tile}] tiles, {cfg['num_warps']} warps" if row_program else
            f"the expert's grid ({B} rows x {s} splits of {nt} x [{tile}] tiles), {cfg['num_warps']} warps")
    return what, call


def topk_expert_parts(expert, args: list, sms: int) -> dict[str, tuple[str, Callable[[], None]]]:
    """The sampler expert's one kernel taken apart (its own code, launched as ``expert.run``
    launches it, on the expert's scratch buffers):

    * ``scan``: the full grid with the split count passed as S + 1, so that no program is the
      last of its row: every split pass (tau estimate, online max and denominator, candidate
      compaction, scratch stores, the arrival atomic), no finaliser;
    * ``finalise``: one program per row (grid (B, 1)) with the row counters preset to S - 1:
      each program scans split 0 again (rewriting what ``scan`` stored there, the same values)
      and finalises the row on the scratch ``scan`` filled (merge, candidate checks, the pivot
      searches, the inverse CDF; the full-row fallback where the expert takes it). Call
      ``scan`` once on the same input set first;
    * ``split_pass``: the split pass alone as a kernel of its own (:func:`_topk_split_pass`, no
      finaliser code compiled in: the registers and occupancy of a two-launch design's first
      launch); ``split_pass_small_tile`` the same pass over the same chunks in
      :data:`SMALL_TILE`-logit tiles with 4 warps (the register footprint per thread, and so the
      programs per SM, of a smaller tile); ``split_pass_prefetch`` that with the next tile's load
      issued before the current tile's reductions.
    """
    logits, temp, top_k, top_p, u = args
    B, V = logits.shape
    dev = logits.device
    cfg = expert._config(B, V)
    s, s_pad, cap = cfg["S"], cfg["S_PAD"], cfg["CAP"]
    ids = torch.empty(B, dtype=torch.int64, device=dev)
    cand_x = torch.empty((B, s_pad, cap), dtype=torch.float32, device=dev)
    cand_i = torch.empty((B, s_pad, cap), dtype=torch.int32, device=dev)
    stats = torch.empty((B, s_pad, 3), dtype=torch.float32, device=dev)
    counts = torch.empty((B, s_pad), dtype=torch.int32, device=dev)
    sem = torch.zeros(B, dtype=torch.int32, device=dev)

    def launch(s_arg: int, grid: tuple[int, int]):
        expert._scan_and_sample_kernel[grid](
            logits, temp, top_k, top_p, u, ids, cand_x, cand_i, stats, counts, sem, V, logits.stride(0),
            cfg["c_sigma"], s_arg, TILE=cfg["TILE"], NT=cfg["NT"], S_PAD=s_pad, CAP=cap, FB_TILE=cfg["FB_TILE"],
            num_warps=cfg["num_warps"], maxnreg=128)

    def scan():
        sem.zero_()
        launch(s + 1, (B, s))

    def finalise():
        sem.fill_(s - 1)
        launch(s, (B, 1))
        return ids

    finalise.scratch = (cand_x, cand_i, stats, counts)  # type: ignore[attr-defined]

    def split_pass(tile: int = cfg["TILE"], warps: int = cfg["num_warps"], prefetch: bool = False):
        _topk_split_pass[(B, s)](logits, temp, cand_x, cand_i, stats, counts, V, logits.stride(0), cfg["c_sigma"],
                                 S_PAD=s_pad, CAP=cap, TILE=tile, NT=cfg["NT"] * cfg["TILE"] // tile, PREFETCH=prefetch,
                                 num_warps=warps)

    small = min(cfg["TILE"], SMALL_TILE)

    return {"scan": (f"the expert's kernel, grid ({B} x {s}), no program finalises (S passed as {s + 1})", scan),
            "finalise": (f"the expert's kernel, grid ({B} x 1): split 0 of each row and its finaliser "
                         f"(counters preset to {s - 1})", finalise),
            "split_pass": (f"the expert's split pass as a kernel of its own (grid ({B} x {s}), no finaliser code: "
                           "its own registers and occupancy)", split_pass),
            "split_pass_small_tile": (f"the same split pass over the same chunks in [{small}] tiles, 4 warps "
                                      "(fewer registers per thread: more programs per SM)",
                                      functools.partial(split_pass, small, 4)),
            "split_pass_prefetch": (f"the same in [{small}] tiles, 4 warps, the next tile loaded before the current "
                                    "tile's reductions", functools.partial(split_pass, small, 4, True))}


#: Arithmetic levels of the w4a16_gemm skeleton (``_w4_fields`` DEQ): row kind and description.
W4_LEVELS = {0: ("skeleton", "no unpacking: the words xor-folded to fp16 bits, one MMA x @ fold per step"),
             1: ("skeleton_dequant", "+ the expert's unpacking of the 8 fields (shifts, masks, - z, * s), summed "
                 "into one MMA per step (no expert MMAs)"),
             2: ("skeleton_dequant_mma", "+ the expert's 8 MMAs per step (8 accumulators); y written by split 0 "
                 "(no FP32 partials, no reduction pass)")}


def w4a16_skeleton(expert, args: list, sms: int, level: int = 0) -> tuple[str, Callable[[], None]]:
    """The w4a16_gemm skeleton of one input set at arithmetic level ``level`` (:data:`W4_LEVELS`):
    the expert's decode plan (``expert._plan``: [BM, BK] x and [BK, BP] word tiles, split-K
    count, warps, stages; its ``_ASM`` unpacking on the GPU), the grid of ``_awq_fields_mma``.
    Moves x [M, K] fp16, qweight [K, N/8] int32, qzeros [K/G, N/8] int32 and scales [K/G, N]
    fp16 once each and writes y [M, N] fp16 once: the floor SOL bytes.

    Raises:
        ValueError: the expert's plan for the shape is not its decode ("fields") kernel.
    """
    x, qweight, qzeros, scales, group_size = args
    M, K = x.shape
    N = scales.shape[1]
    G = int(group_size)
    p = expert._plan(M, N, K, G, sms)
    if p["kind"] != "fields":
        raise ValueError(f"the w4a16 skeleton follows the decode kernel; the expert's plan here is {p['kind']!r}")
    asm = bool(p.get("asm", expert._ASM)) and not _INTERPRET
    _bind_w4(expert)
    s32 = scales.view(torch.int32)                         # adjacent column pairs as one word (same storage)
    y = torch.empty((M, N), dtype=torch.float16, device=x.device)
    grid = (triton.cdiv(N // 8, p["BP"]), p["S"], triton.cdiv(M, p["BM"]))
    sink = _sink_buf(grid[0] * grid[1] * grid[2], x.device)

    def call():
        _w4_fields[grid](x, qweight, qzeros, scales, s32, y, sink, M, N, K, x.stride(0), qweight.stride(0),
                         qzeros.stride(0), scales.stride(0), s32.stride(0), G=G, BM=p["BM"], BP=p["BP"], BK=p["BK"],
                         SPLIT_K=p["S"], ASM=asm, DEQ=level, num_warps=p["warps"], num_stages=p["stages"])
        return y

    call.outputs = {"y": y}  # type: ignore[attr-defined]
    what = (f"grid {grid} (strips of {p['BP']} words x split {p['S']} x m tiles of {p['BM']}), [{p['BK']} x "
            f"{p['BP']}] words per step, {p['warps']} warps, {p['stages']} stages{', asm' if asm else ''}; "
            f"{W4_LEVELS[level][1]}")
    return what, call


SKELETONS = {"mla_decode_absorbed": mla_skeleton, "cascade_prefix_decode": cascade_skeleton,
             "lora_shrink_expand": lora_skeleton, "fused_qkv_norm_rope_cache": qkv_skeleton,
             "allreduce_residual_rmsnorm": allreduce_skeleton, "topk_topp_sampling": topk_skeleton,
             "w4a16_gemm": w4a16_skeleton}


def flat_reader(nbytes: int, device, sms: int, n_sets: int) -> Callable[[int], None]:
    """``call(i)``: read ``nbytes`` (rounded up to a 2-byte element) of segment ``i`` of a buffer
    of ``n_sets`` contiguous segments (rotating like the input sets)."""
    n = (nbytes + 1) // 2
    buf = torch.zeros(n * n_sets, dtype=torch.bfloat16, device=device)
    block = 8192
    progs = 4 * sms
    per_prog = triton.cdiv(triton.cdiv(n, progs), block) * block
    sink = _sink_buf(progs, device)

    def call(i: int):
        seg = buf[i * n:(i + 1) * n]
        _flat_read[(progs,)](seg, sink, n, per_prog, BLOCK=block, num_warps=8)
    return call


# ----------------------------------------------------------------------------------------------
# byte accounting (CPU interpreter) and SOL bytes
# ----------------------------------------------------------------------------------------------

def sol_bytes(task, workload) -> float:
    """The floor SOL model's bytes of a workload (``task.yaml`` ``sol.floor``)."""
    from d2kbench.tasks.formula import evaluate_formula

    sol = task.spec.sol
    return float(evaluate_formula(sol.counts(sol.floor).bytes, workload.axes))


def count_bytes(fn: Callable[[], object], buffers: dict[str, torch.Tensor]) -> dict[str, dict[str, int]]:
    """Run ``fn`` (Triton launches) under the CPU interpreter (``TRITON_INTERPRET=1`` before
    triton was imported) and count, per named buffer, the bytes its masked loads and stores
    touch: ``read`` / ``written`` (distinct bytes: what HBM must move when the L2 catches the
    repeats) and ``read_requested`` (every load, repeats included). Accesses outside the named
    buffers (intermediates, the sink) are counted under ``"other"``.

    Raises:
        RuntimeError: the interpreter is not active.
    """
    import numpy as np
    from triton.runtime import interpreter as interp

    if not _INTERPRET:
        raise RuntimeError("count_bytes needs TRITON_INTERPRET=1")
    loads: list[tuple[np.ndarray, int]] = []
    stores: list[tuple[np.ndarray, int]] = []
    cls = interp.InterpreterBuilder
    orig_load, orig_store = cls.create_masked_load, cls.create_masked_store

    def _size(ptrs) -> int:
        return ptrs.get_element_ty().primitive_bitwidth // 8

    def load(self, ptrs, mask, other, *a):
        m = np.broadcast_to(mask.data.astype(bool), ptrs.data.shape)   # an int8 mask would index, not select
        loads.append((ptrs.data[m].astype(np.uint64).ravel(), _size(ptrs)))
        return orig_load(self, ptrs, mask, other, *a)

    def store(self, ptrs, value, mask, *a):
        m = np.broadcast_to(mask.data.astype(bool), ptrs.data.shape)   # an int8 mask would index, not select
        stores.append((ptrs.data[m].astype(np.uint64).ravel(), _size(ptrs)))
        return orig_store(self, ptrs, value, mask, *a)

    cls.create_masked_load, cls.create_masked_store = load, store
    try:
        fn()
    finally:
        cls.create_masked_load, cls.create_masked_store = orig_load, orig_store
    spans = {name: (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for name, t in buffers.items()}
    out = {name: {"read": 0, "written": 0, "read_requested": 0} for name in [*buffers, "other"]}

    def account(recs, key: str, requested: str | None):
        if not recs:
            return
        addr = np.concatenate([a for a, _ in recs])
        size = np.concatenate([np.full(a.shape, s, dtype=np.uint64) for a, s in recs])
        claimed = np.zeros(addr.shape, dtype=bool)
        for name, (lo, hi) in spans.items():
            sel = (addr >= lo) & (addr < hi)
            claimed |= sel
            for sz in np.unique(size[sel]):                  # distinct elements x their size
                out[name][key] += int(np.unique(addr[sel & (size == sz)]).size) * int(sz)
            if requested:
                out[name][requested] += int(size[sel].sum())
        rest = ~claimed
        out["other"][key] += int(size[rest].sum())
        if requested:
            out["other"][requested] += int(size[rest].sum())

    account(loads, "read", "read_requested")
    account(stores, "written", None)
    return out


def skeleton_bytes(task_id: str, args: list, names: list[str], sms: int = 4, **kw) -> dict[str, dict[str, int]]:
    """:func:`count_bytes` of the task's skeleton on one input set (CPU interpreter)."""
    from d2kbench.tasks import load_task
    from d2kbench.tasks.loader import import_file

    task = load_task(task_id)
    expert = import_file(task.resolve_solution("expert"))
    _, call = SKELETONS[task_id](expert, args, sms, **kw)
    buffers = {n: a for n, a in zip(names, args) if isinstance(a, torch.Tensor)}
    for n, a in zip(names, args):
        if isinstance(a, list):                                          # a tensor list: name_0, name_1, ...
            buffers.update({f"{n}_{r}": t for r, t in enumerate(a) if isinstance(t, torch.Tensor)})
    return count_bytes(call, {**buffers, **getattr(call, "outputs", {})})


# ----------------------------------------------------------------------------------------------
# GPU measurement
# ----------------------------------------------------------------------------------------------

#: ``--dry-run`` (CPU interpreter): a smoke workload stands in for each task's registered ones.
DRY = {"mla_decode_absorbed": "smoke_b2_h80_two_blocks", "cascade_prefix_decode": "smoke_n6_h4x2_d32_p40",
       "lora_shrink_expand": "smoke_t24_k64_s3_decode", "fused_qkv_norm_rope_cache": "smoke_t6_h4x2_d32_decode",
       "allreduce_residual_rmsnorm": "smoke_r4_t7_h384_quant", "topk_topp_sampling": "smoke_b3_v1000_kp",
       "w4a16_gemm": "smoke_m16_n128_k1024"}


def _n_sets(args: list, l2: int) -> int:
    """The worker's graph-timing input sets: enough for 3x the L2 (d2kbench.harness.worker)."""
    from d2kbench.checking.inputs import args_nbytes

    return int(min(4, max(1, -(-3 * l2 // max(1, args_nbytes(args))))))


def measure(only: list[str] | None = None, target_ms: float = 150.0, budget_s: float | None = None,
            on_workload: Callable[[dict], None] | None = None, dry_run: bool = False,
            candidates: list[str] | None = None) -> dict:
    """Graph-timed per-call medians of the skeletons, flat reads, compute skeletons and experts;
    GPU only. A workload is started only while ``budget_s`` (seconds since the call) leaves room
    (the rest get a ``skipped`` row); ``on_workload(result so far)`` runs after each workload.
    ``dry_run``: the host logic on the CPU (interpreter, :data:`DRY` smoke workloads, each call
    run once and reported as 1 ms). ``candidates``: solution files of the selected task(s) timed
    like the expert (row ``candidate:<file stem>``; timing only, their correctness is checked
    elsewhere).

    Raises:
        RuntimeError: no GPU.
    """
    from d2kbench.checking.inputs import make_args
    from d2kbench.harness import timing
    from d2kbench.harness.env import fingerprint
    from d2kbench.scoring.sol import ceilings
    from d2kbench.tasks import load_task
    from d2kbench.tasks.formula import evaluate_formula
    from d2kbench.tasks.loader import import_file

    if not dry_run and not torch.cuda.is_available():
        raise RuntimeError("the skeletons are timed on a GPU")
    dev = "cpu" if dry_run else "cuda"
    props = torch.cuda.get_device_properties(0) if not dry_run else None
    sms = props.multi_processor_count if props else 4
    l2 = props.L2_cache_size if props else 50 << 20
    gpu = props.name if props else "H200"
    try:
        ceil = ceilings(gpu, "measured")
        hbm, tc = ceil.hbm_tbps, ceil.bf16_tflops
    except ValueError:
        hbm, tc = MEASURED_HBM_TBPS, MEASURED_BF16_TFLOPS
    rows: list[dict] = []
    t_start = time.monotonic()
    res = {"environment": fingerprint(dev), "hbm_tbps": hbm, "bf16_tflops": tc, "rows": rows,
           "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}

    def t(call, n_sets):
        if dry_run:
            for i in range(n_sets):
                call(i)
            return 1.0
        st = timing.time_graph(call, n_sets, warmup_ms=50.0, min_samples=10, max_samples=40, target_ms=target_ms)
        return st.median_ms

    def row(task_id, wid, kind, what, ms, nbytes, flops=None, **extra):
        r = {"task": task_id, "workload": wid, "kind": kind, "what": what, "median_ms": ms, "sol_bytes": nbytes,
             "tbps": nbytes / (ms * 1e-3) / 1e12 if ms else None, **extra}
        r["pct_hbm"] = 100.0 * r["tbps"] / hbm if r["tbps"] else None
        if flops is not None:
            r["tflops"] = flops / (ms * 1e-3) / 1e12
            r["pct_bf16"] = 100.0 * r["tflops"] / tc
        rows.append(r)
        print(f"{task_id}/{wid} {kind}: {ms * 1e3:.1f} us, {r['tbps']:.3f} TB/s ({r['pct_hbm']:.1f}% HBM)"
              + (f", {r['tflops']:.0f} TFLOP/s ({r['pct_bf16']:.1f}%)" if flops is not None else ""), flush=True)

    def copy_rows(task_id: str, wid: str, axes: dict, nbytes: float, n_sets: int, fsets: int) -> None:
        rd, wr = sol_split(task_id, axes)
        progs = 4 * sms
        for kind, sets_ in (("flat_copy_sets", n_sets), ("flat_copy", fsets))[int(n_sets == fsets):]:
            row(task_id, wid, kind, f"contiguous copy: {rd / 1e6:.2f} MB read, {wr / 1e6:.2f} MB written, {progs} "
                f"programs of 8 KB tiles, {sets_} rotating buffer(s)",
                t(flat_copier(int(rd), int(wr), dev, progs, sets_), sets_), nbytes)
            row(task_id, wid, kind.replace("flat", "torch"), f"PyTorch copy_ of {nbytes / 2e6:.2f} MB, {sets_} "
                "rotating buffer(s)", t(torch_copier(int(nbytes), dev, sets_), sets_), nbytes)
        if task_id not in RAMP_TASKS:
            return
        for per_sm in (1, 2, 8):
            row(task_id, wid, f"flat_copy_{per_sm}x_sms", f"the cold copy with {per_sm * sms} programs",
                t(flat_copier(int(rd), int(wr), dev, per_sm * sms, fsets), fsets), nbytes)
        for mult in (4, 16):
            ms_ = max(1, fsets // mult)
            row(task_id, wid, f"flat_copy_bytes_x{mult}", f"the cold copy of {mult}x the bytes, {progs} programs, "
                f"{ms_} rotating buffer(s)", t(flat_copier(int(rd) * mult, int(wr) * mult, dev, progs, ms_), ms_),
                nbytes * mult)

    def one(task_id: str, wid: str) -> None:
        task = load_task(task_id)
        ref = task.reference_module()
        expert = import_file(task.resolve_solution("expert"))
        wl = task.spec.workload(DRY[task_id] if dry_run else wid)
        nbytes = sol_bytes(task, wl)
        first = make_args(ref, task.spec, wl, 1000, dev)
        n_sets = _n_sets(first, l2)
        sets = [first] + [make_args(ref, task.spec, wl, 1000 + s, dev) for s in range(1, n_sets)]
        exp_ms = t(lambda i: expert.run(*sets[i]), n_sets)       # also autotunes the expert first
        calls = [SKELETONS[task_id](expert, a, sms) for a in sets]
        row(task_id, wid, "skeleton", calls[0][0], t(lambda i: calls[i][1](), n_sets), nbytes)
        if task_id == "allreduce_residual_rmsnorm":
            for level in (1, 2, 3) if int(wl.axes["Q"]) else (1,):
                lv = [allreduce_skeleton(expert, a, sms, level) for a in sets]
                row(task_id, wid, AR_LEVELS[level][0], lv[0][0], t(lambda i, lv=lv: lv[i][1](), n_sets), nbytes)
        if task_id == "w4a16_gemm":
            for level in (1, 2):
                lv = [w4a16_skeleton(expert, a, sms, level) for a in sets]
                row(task_id, wid, W4_LEVELS[level][0], lv[0][0], t(lambda i, lv=lv: lv[i][1](), n_sets), nbytes)
        if task_id == "cascade_prefix_decode":
            split = [cascade_skeleton(expert, a, sms, split_prefix=True) for a in sets]
            row(task_id, wid, "skeleton_split", split[0][0], t(lambda i: split[i][1](), n_sets), nbytes)
        if task_id == "topk_topp_sampling":
            per_row = [topk_skeleton(expert, a, sms, row_program=True) for a in sets]
            row(task_id, wid, "row_program", per_row[0][0], t(lambda i: per_row[i][1](), n_sets), nbytes)
        fsets = 1 if dry_run else max(n_sets, int(-(-3 * l2 // int(nbytes))))
        row(task_id, wid, "flat", f"contiguous read of the SOL bytes, {4 * sms} programs, {fsets} rotating buffers",
            t(flat_reader(int(nbytes), dev, sms, fsets), fsets), nbytes)
        if task_id in COPY_TASKS:
            copy_rows(task_id, wid, wl.axes, nbytes, n_sets, fsets)
        tc_sol = evaluate_formula(task.spec.sol.counts(task.spec.sol.floor).tc_flops, wl.axes)
        row(task_id, wid, "expert", "the expert's run()", exp_ms, nbytes, flops=tc_sol or None)
        for path in candidates or []:
            cand = import_file(Path(path), f"candidate_{Path(path).stem}")
            row(task_id, wid, f"candidate:{Path(path).stem}", f"{path}: its run()",
                t(lambda i, cand=cand: cand.run(*sets[i]), n_sets), nbytes, flops=tc_sol or None)
        if task_id == "topk_topp_sampling":
            parts = [topk_expert_parts(expert, a, sms) for a in sets]
            row(task_id, wid, "scan", parts[0]["scan"][0], t(lambda i: parts[i]["scan"][1](), n_sets), nbytes)
            for p in parts:          # the scratch of every input set, for the finalisers
                p["scan"][1]()
            row(task_id, wid, "finalise", parts[0]["finalise"][0], t(lambda i: parts[i]["finalise"][1](), n_sets),
                nbytes)
            for kind in ("split_pass", "split_pass_small_tile", "split_pass_prefetch"):
                row(task_id, wid, kind, parts[0][kind][0], t(lambda i, kind=kind: parts[i][kind][1](), n_sets), nbytes)
        compute = []
        if task_id == "cascade_prefix_decode":
            compute.append(("prefix_mma_softmax", cascade_prefix_compute(expert, sets[0], sms)))
        if (task_id, wid) in COMPUTE or (dry_run and task_id == "mla_decode_absorbed"):
            compute += [("mma_softmax" if sm else "mma", mla_compute(expert, sets[0], sms, sm)) for sm in (False, True)]
        for kind, (what, call, flops) in compute:
            ms = t(lambda i, call=call: call(), 1)
            row(task_id, wid, kind, what, ms, nbytes, flops=tc_sol, skeleton_mma_tflops=flops / (ms * 1e-3) / 1e12)

    for task_id, wid in WORKLOADS:
        if only and f"{task_id}/{wid}" not in only and task_id not in only:
            continue
        if budget_s is not None and time.monotonic() - t_start > budget_s:
            rows.append({"task": task_id, "workload": wid, "kind": "skipped", "what": f"time budget {budget_s} s spent"})
            continue
        try:
            one(task_id, wid)
        except Exception as e:  # noqa: BLE001 - one workload's failure must not lose the others
            rows.append({"task": task_id, "workload": wid, "kind": "error", "what": f"{type(e).__name__}: {e}"[:400]})
            print(f"{task_id}/{wid}: ERROR {type(e).__name__}: {e}", flush=True)
        if not dry_run:
            torch.cuda.empty_cache()
        if on_workload is not None:
            on_workload(res)
    return res


def markdown(res: dict) -> str:
    """The measurement as a markdown table."""
    env = res["environment"]
    lines = [f"# Bandwidth skeletons ({env.get('gpu')}, driver {env.get('driver')}, torch {env.get('torch')}, "
             f"triton {env.get('triton')}, {res['time_utc']})", "",
             "Written by `devtools/bandwidth_skeletons.py`. Graph-timed per-call medians (the harness's timer, "
             "the benchmark's input-set rotation). `skeleton`: the task's SOL bytes moved in the expert's access "
             "pattern (grid, tiles, page gathers), no arithmetic; `flat`: the same bytes from one contiguous "
             f"buffer; `expert`: the expert. % HBM against the measured {res['hbm_tbps']} TB/s; TB/s counts the "
             f"SOL bytes. Compute rows: % of {res['bf16_tflops']} TFLOP/s for the task's tensor-core SOL FLOPs.", "",
             "| task | workload | kind | SOL MB | us per call | TB/s | % HBM | TFLOP/s (% bf16) | what |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        if r["kind"] in ("error", "skipped"):
            lines.append(f"| {r['task']} | {r['workload']} | {r['kind']} | | | | | | {r['what']} |")
            continue
        tf = f"{r['tflops']:.0f} ({r['pct_bf16']:.1f})" if "tflops" in r else ""
        what = r["what"] + (f"; its own MMAs {r['skeleton_mma_tflops']:.0f} TFLOP/s" if "skeleton_mma_tflops" in r else "")
        lines.append(f"| {r['task']} | {r['workload']} | {r['kind']} | {r['sol_bytes'] / 1e6:.1f} | "
                     f"{r['median_ms'] * 1e3:.1f} | {r['tbps']:.3f} | {r['pct_hbm']:.1f} | {tf} | {what} |")
    lines += [line for line in (ramp_line(res, w) for w in dict.fromkeys(r["workload"] for r in res["rows"])) if line]
    return "\n".join(lines) + "\n"


def ramp_line(res: dict, workload: str) -> str | None:
    """The fixed cost of one launch from the cold copy at 1x, 4x and 16x the SOL bytes (a
    least-squares line of time over bytes: intercept us, slope TB/s), and the best % of the HBM
    ceiling that line allows at 1x; None without those rows."""
    pts = {r["kind"]: r for r in res["rows"] if r["workload"] == workload and r.get("median_ms")}
    use = [pts[k] for k in ("flat_copy", "flat_copy_bytes_x4", "flat_copy_bytes_x16") if k in pts]
    if len(use) < 2:
        return None
    xs = [r["sol_bytes"] for r in use]
    ys = [r["median_ms"] * 1e-3 for r in use]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    icpt = my - slope * mx
    if slope <= 0:                                   # no rate to fit (a dry run's constant times)
        return None
    one = xs[0] / (icpt + slope * xs[0]) / 1e12
    return (f"\n{workload}: cold copy time = {icpt * 1e6:.2f} us + bytes / {1 / slope / 1e12:.2f} TB/s (1x, 4x, 16x "
            f"the SOL bytes); at 1x ({xs[0] / 1e6:.1f} MB) that line gives {100 * one / res['hbm_tbps']:.1f}% of "
            f"{res['hbm_tbps']} TB/s.")


def _empty_args(task, wl) -> list:
    """Arguments of the workload's shapes and dtypes without values (``torch.empty``: the
    skeletons' host code reads none; compile-only)."""
    from d2kbench.tasks.formula import evaluate_formula
    from d2kbench.tasks.schema import TensorArg

    vals = wl.values()
    out: list = []
    for a in task.spec.args:
        if isinstance(a, TensorArg):
            shape = [int(evaluate_formula(str(d), wl.axes)) for d in a.shape]
            dtype = getattr(torch, str(vals.get(a.dtype_param, a.dtype)) if a.dtype_param else a.dtype)
            count = int(wl.axes[a.count]) if a.count else 0
            out.append([torch.empty(shape, dtype=dtype) for _ in range(count)] if a.count
                       else torch.empty(shape, dtype=dtype))
        elif getattr(a, "axis", None):
            out.append(int(wl.axes[a.axis]))
        elif a.name == "common_prefix_len":
            out.append(int(wl.axes["P"]))
        else:
            out.append(1.0)
    return out


def compile_only(only: list[str] | None = None, candidates: list[str] | None = None) -> int:
    """Compile every skeleton for sm_90 at the registered shapes without a GPU (devtools/
    compile_sm90.py's stand-in driver), for every config the expert's autotuner may choose
    (mla, cascade); returns the number of failed compiles. With ``TRITON_CACHE_DIR`` set, the
    cubins land there (a GPU run with the same Triton can reuse them)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import compile_sm90 as c  # noqa: PLC0415 - changes nothing until install()

    from d2kbench.tasks import load_task
    from d2kbench.tasks.loader import import_file

    c.install()
    failed = 0
    for task_id, wid in WORKLOADS:
        if only and f"{task_id}/{wid}" not in only and task_id not in only:
            continue
        task = load_task(task_id)
        expert = import_file(task.resolve_solution("expert"))
        wl = task.spec.workload(wid)
        args = _empty_args(task, wl)
        calls: list[tuple[str, Callable[[], object]]] = []
        # every config the expert's autotuner may pick on the GPU (the skeletons follow its choice)
        tuned = {"mla_decode_absorbed": "_latent_kernel", "cascade_prefix_decode": "_cascade_kernel"}.get(task_id)
        kernel = getattr(expert, tuned) if tuned else None
        configs = kernel.configs if kernel is not None else [None]
        if task_id == "mla_decode_absorbed":
            configs = expert._prune(configs, {"H": wl.axes["H"], "PAGE": wl.axes["PS"]})
        for cfg in configs:
            if kernel is not None:
                kernel.best_config = cfg
            calls.append(("skeleton", SKELETONS[task_id](expert, args, c.H200_SMS)[1]))
            if task_id == "allreduce_residual_rmsnorm":
                calls += [(AR_LEVELS[lv][0], allreduce_skeleton(expert, args, c.H200_SMS, lv)[1]) for lv in (1, 2, 3)]
            if task_id == "w4a16_gemm":
                calls += [(W4_LEVELS[lv][0], w4a16_skeleton(expert, args, c.H200_SMS, lv)[1]) for lv in (1, 2)]
            if task_id in COPY_TASKS:
                rd, wr = sol_split(task_id, wl.axes)
                calls.append(("flat_copy", functools.partial(flat_copier(int(rd), int(wr), "cpu", 4 * c.H200_SMS, 1), 0)))
            if task_id == "topk_topp_sampling":
                calls.append(("row_program", topk_skeleton(expert, args, c.H200_SMS, row_program=True)[1]))
                calls += [(kind, call) for kind, (_, call) in topk_expert_parts(expert, args, c.H200_SMS).items()]
            if task_id == "cascade_prefix_decode":
                calls.append(("skeleton_split", cascade_skeleton(expert, args, c.H200_SMS, split_prefix=True)[1]))
                calls.append(("prefix_mma_softmax", cascade_prefix_compute(expert, args, c.H200_SMS)[1]))
            if (task_id, wid) in COMPUTE:
                args[4] = torch.full_like(args[4], int(wl.axes["MAXP"]) * int(wl.axes["PS"]))  # tile counts
                for sm in (False, True):
                    calls.append(("mma_softmax" if sm else "mma", mla_compute(expert, args, c.H200_SMS, sm)[1]))
        flat = flat_reader(int(sol_bytes(task, wl)), "cpu", c.H200_SMS, 1)   # calloc: no pages touched
        calls.append(("flat", functools.partial(flat, 0)))
        for path in candidates or []:
            cand = import_file(Path(path), f"candidate_{Path(path).stem}")
            calls.append((f"candidate:{Path(path).stem}", functools.partial(cand.run, *args)))
        for name, call in calls:
            c.LAUNCHES.clear()
            call()
            for rec in c.LAUNCHES:
                failed += "error" in rec
                status = rec.get("error") or "ok, " + ", ".join(
                    f"{k} {v}" for k, v in c._resources(rec["compiled"]).items() if k in ("reg", "shared", "stack"))
                print(f"{task_id}/{wid} {name}: {rec['kernel']} grid {rec['grid']}: {status[:3000]}", flush=True)
    return failed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="+", help="TASK or TASK/WORKLOAD")
    ap.add_argument("--target-ms", type=float, default=150.0, help="sampling time per timing")
    ap.add_argument("--budget-s", type=float, help="start no workload after this many seconds")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    ap.add_argument("--candidate", nargs="+", default=[], help="solution files timed like the expert (timing only)")
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--dry-run", action="store_true", help="host logic on the CPU (TRITON_INTERPRET=1, smoke workloads)")
    a = ap.parse_args()
    if a.compile_only:
        return 1 if compile_only(a.only, a.candidate) else 0

    def write(res: dict) -> None:
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=1))
        if a.markdown:
            Path(a.markdown).write_text(markdown(res))

    res = measure(a.only, a.target_ms, a.budget_s, on_workload=write, dry_run=a.dry_run, candidates=a.candidate)
    write(res)
    print(markdown(res))
    return 0 if all(r["kind"] != "error" for r in res["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
