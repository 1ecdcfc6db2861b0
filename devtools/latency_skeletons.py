"""Measured lower bounds for latency-class workloads: the per-call time of design skeletons.

The latency bar (docs/timing.md) is "within 3x of the launch floor" (a one-store, one-program Triton
kernel in a CUDA graph). A real operator cannot be cheaper than the dependent memory steps its
algorithm needs, whatever the arithmetic. This script times *skeletons*: kernels that do only
those steps (loads, atomics, a barrier, stores) and no useful work, with the harness's own
graph timer (:func:`d2kbench.harness.timing.time_graph`, >= 64 calls per replay, as the launch
floor and the benchmark's graph-timed workloads). A skeleton's time is a floor for every design
that contains its chain of steps; where it is already near or above 3x the launch floor, the
bar is out of reach for that class of design, and the note can say so with a number.

Skeletons (``n`` ids, ``E`` bins, ``P`` = one program per SM):

* ``floor``: the launch floor itself (:func:`d2kbench.harness.launch_floor.launch_floor_ms`).
* ``wide_store``: 128 one-warp programs, each storing 256 bytes (a wide grid, no loads).
* ``load_store``: 128 one-warp programs; each loads an int64 slot and a 512-byte row, then
  stores the row at the slot's address (a scatter: one load round trip before the store; the
  kv-cache decode store's chain).
* ``cta_atomic_rank``: one 8-warp program loads ``n`` int32 ids, takes a per-id
  ``atomic_add`` on E counters (the returned old value is the rank), and stores each id at its
  rank (the single-CTA align decode chain without the scan and the padding).
* ``grid_barrier``: P programs each load ``n / P`` ids, histogram them, add the histogram to
  global counts with one vector atomic, arrive at a counter and spin until all P programs have
  arrived, then store their ids (a one-launch counting sort's chain without scan or sort).
* ``two_launch``: P programs load ``n / P`` ids and store a histogram each, then a second
  launch of P programs loads every program's histogram row and stores it (the shortest
  two-launch chain with a dependency between the launches).

Serial chunk chains of the recurrent tasks (:data:`CHAINS`, one row per registered workload,
``--chains``; their bar is "within 1.5x of a measured skeleton of the design's dependent
steps"): each program carries an fp32 state tile through ``steps`` chunk steps and does only
what one step of the design's state pass must do on it, on operand tiles that stay in L2 (no
stores until the final state):

* ``gdn_state_chain`` (gated_deltanet_chunk_prefill): per chunk load W (64 x K), U (64 x BV) and
  K (64 x K) bf16, ``V' = U - W S``, ``S = g S + K^T V'`` (two dependent bf16 MMAs and a decay);
  programs = sequences x value heads x V / BV, steps = chunks of 64 of the longest sequence.
* ``ssd_state_chain`` (mamba2_ssd_chunk_scan): per chunk load x (Q x P) and B (Q x BN) bf16,
  scale x, ``S = a S + x^T B`` (one MMA and a fused multiply-add); programs = sequences x heads x
  DS / BN, steps = chunks of Q of the longest sequence.

Routing skeletons of moe_grouped_topk (``--routing``, one row per registered workload of
:data:`ROUTING`, on the task's own ``make_inputs`` in the worker's input-set rotation; its bar is
the latency bar): the expert's grid (the rows per program and warps its autotuner picked on this
GPU) loads the [T, E] float32 logits and the bias and stores k weights and k ids per row, with
:data:`ROUTE_STEPS` of the selection's dependent steps: ``route_load_store`` one row sum (the
bytes only), ``route_group_stage`` one max per group, the group rank and one expert max,
``route_topk_chain`` the group stage and k rounds of max-and-remove (no sigmoid, no 64-bit
keys, no weight gather); ``expert`` the expert on the same inputs and timer. ``--sweep`` (or
``--sweep-only``) adds the best time of the load+store and of the chain over every config of
the expert's autotuner. tests/test_latency_skeletons.py checks under the interpreter that every
level moves the task's SOL bytes and that the chain selects the top-k.

Usage (repo root, a GPU)::

    PYTHONPATH=src python3 devtools/latency_skeletons.py [--ids 2048 131072 ...] [--experts 256]
        [--chains] [--routing] [--sweep | --sweep-only] [--json FILE] [--markdown FILE]
    PYTHONPATH=src TRITON_INTERPRET=1 python devtools/latency_skeletons.py --ids --routing --dry-run   # CPU
    PYTHONPATH=src python devtools/latency_skeletons.py --compile-only    # no GPU: sm_90 compile

Diagnostic, not a benchmark: the inputs stay resident in the L2 between replays, as those of
the benchmark's latency-class workloads do (their input sets are a few hundred KB).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

#: Programs of the wide skeletons that stand for a decode-sized scatter (one per SM or fewer).
WIDE_PROGRAMS = 128


@triton.jit
def _wide_store(out_ptr, ROW: tl.constexpr):
    """Program p stores ROW int8 zeros at out[p * ROW]."""
    offs = tl.program_id(0) * ROW + tl.arange(0, ROW)
    tl.store(out_ptr + offs, tl.zeros([ROW], dtype=tl.int8))


@triton.jit
def _load_store(src_ptr, slot_ptr, dst_ptr, ROW: tl.constexpr):
    """Program p loads slot[p] (int64) and the bf16 row src[p, :ROW], stores it at dst[slot[p]]."""
    p = tl.program_id(0)
    cols = tl.arange(0, ROW)
    slot = tl.load(slot_ptr + p)
    row = tl.load(src_ptr + p * ROW + cols)
    tl.store(dst_ptr + slot * ROW + cols, row)


@triton.jit
def _cta_atomic_rank(ids_ptr, cnt_ptr, out_ptr, n, N_PAD: tl.constexpr, OUT_MASK: tl.constexpr):
    """One program: rank_i = atomic_add(cnt[id_i], 1); out[rank_i & OUT_MASK] = i (the counters
    grow across calls, the mask keeps the stores in the buffer)."""
    offs = tl.arange(0, N_PAD)
    m = offs < n
    e = tl.load(ids_ptr + offs, mask=m, other=0)
    rank = tl.atomic_add(cnt_ptr + e, 1, mask=m, sem="relaxed")
    tl.store(out_ptr + (rank & OUT_MASK), offs, mask=m)


@triton.jit
def _grid_barrier(ids_ptr, cnt_ptr, arrive_ptr, out_ptr, n, CHUNK: tl.constexpr, E: tl.constexpr):
    """P programs: histogram CHUNK ids, one vector atomic into cnt[E], arrive, spin until the
    P programs of this call have arrived (a generation count: no reset between calls), store."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs = pid * CHUNK + tl.arange(0, CHUNK)
    m = offs < n
    e = tl.load(ids_ptr + offs, mask=m, other=0)
    hist = tl.histogram(e, E, mask=m)
    old = tl.atomic_add(cnt_ptr + tl.arange(0, E), hist, mask=hist > 0, sem="relaxed")
    ticket = tl.atomic_add(arrive_ptr, 1, sem="acq_rel")
    target = (ticket // nprog + 1) * nprog
    cur = tl.load(arrive_ptr, volatile=True)
    while cur < target:
        cur = tl.load(arrive_ptr, volatile=True)
    tl.store(out_ptr + offs, e + tl.sum(old, 0) * 0, mask=m)


@triton.jit
def _hist_rows(ids_ptr, rows_ptr, n, CHUNK: tl.constexpr, E: tl.constexpr):
    """Program p stores the histogram of ids [p * CHUNK, +CHUNK) as rows[p, :E]."""
    pid = tl.program_id(0)
    offs = pid * CHUNK + tl.arange(0, CHUNK)
    m = offs < n
    hist = tl.histogram(tl.load(ids_ptr + offs, mask=m, other=0), E, mask=m)
    tl.store(rows_ptr + pid * E + tl.arange(0, E), hist)


@triton.jit
def _read_rows(rows_ptr, out_ptr, E: tl.constexpr):
    """Program p loads rows[p, :E] (written by the previous launch) and stores it to out."""
    offs = tl.program_id(0) * E + tl.arange(0, E)
    tl.store(out_ptr + offs, tl.load(rows_ptr + offs))


@triton.jit
def _gdn_chain(w_ptr, u_ptr, k_ptr, out_ptr, steps, K: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
               TILES: tl.constexpr):
    """Gated DeltaNet state pass without its stores: per step V' = U - W S, S = 0.99 S + K^T V'."""
    pid = tl.program_id(0)
    rk = tl.arange(0, K)
    rt = tl.arange(0, BT)
    cv = tl.arange(0, BV)
    S = tl.zeros([K, BV], dtype=tl.float32)
    for c in range(steps):
        j = (pid + c) % TILES
        w = tl.load(w_ptr + j * BT * K + rt[:, None] * K + rk[None, :])
        u = tl.load(u_ptr + j * BT * BV + rt[:, None] * BV + cv[None, :])
        kk = tl.load(k_ptr + j * BT * K + rt[:, None] * K + rk[None, :])
        vn = u.to(tl.float32) - tl.dot(w, S.to(tl.bfloat16))
        S = S * 0.99 + tl.dot(tl.trans(kk), vn.to(tl.bfloat16))
    tl.store(out_ptr + pid * K * BV + rk[:, None] * BV + cv[None, :], S)


@triton.jit
def _ssd_chain(x_ptr, b_ptr, out_ptr, steps, P: tl.constexpr, BN: tl.constexpr, Q: tl.constexpr,
               TILES: tl.constexpr):
    """Mamba2 SSD state pass without its stores: per step S = 0.99 S + (0.5 x)^T B."""
    pid = tl.program_id(0)
    rp = tl.arange(0, P)
    rq = tl.arange(0, Q)
    cn = tl.arange(0, BN)
    S = tl.zeros([P, BN], dtype=tl.float32)
    for c in range(steps):
        j = (pid + c) % TILES
        x = tl.load(x_ptr + j * Q * P + rq[:, None] * P + rp[None, :])
        b = tl.load(b_ptr + j * Q * BN + rq[:, None] * BN + cn[None, :])
        xs = (x.to(tl.float32) * 0.5).to(tl.bfloat16)
        S = S * 0.99 + tl.dot(tl.trans(xs), b)
    tl.store(out_ptr + pid * P * BN + rp[:, None] * BN + cn[None, :], S)


@triton.jit
def _route_steps(logits_ptr, bias_ptr, w_ptr, ids_ptr, T, E: tl.constexpr, G: tl.constexpr, GSZ: tl.constexpr,
                 G_PAD: tl.constexpr, GSZ_PAD: tl.constexpr, TOPK_GROUP: tl.constexpr, K: tl.constexpr,
                 K_PAD: tl.constexpr, BT: tl.constexpr, STEPS: tl.constexpr):
    """Grid (cdiv(T, BT),): the moe_grouped_topk expert's [BT, G, E/G] tiles of logits + bias and
    its [BT, k] stores of weights and ids, with STEPS of its dependent reductions: 0 one row sum
    (load + store), 1 one max per group, the group rank (G x G compares) and one expert max,
    2 the group stage and k rounds of "max, remove it" (the expert top-k). No sigmoid, no
    64-bit keys, no weight gather: the stored values are the maxima (ids: their bits)."""
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    rmask = rows < T
    g = tl.arange(0, G_PAD)
    j = tl.arange(0, GSZ_PAD)
    expert = g[:, None] * GSZ + j[None, :]
    emask = (g < G)[:, None] & (j < GSZ)[None, :]
    valid = rmask[:, None, None] & emask[None, :, :]
    row_off = rows.to(tl.int64) * E
    x = tl.load(logits_ptr + row_off[:, None, None] + expert[None, :, :], mask=valid, other=0.0)
    b = tl.load(bias_ptr + expert, mask=emask, other=0.0)
    kk = tl.arange(0, K_PAD)
    if STEPS == 0:
        tot = tl.sum(tl.sum(x + b[None, :, :], axis=2), axis=1)
        wv = tl.zeros([BT, K_PAD], dtype=tl.float32) + tot[:, None]
    else:
        c = tl.where(valid, x + b[None, :, :], float("-inf"))
        if G > 1:
            gm = tl.where((g < G)[None, :], tl.max(c, axis=2), float("-inf"))        # one reduction per group
            gi = gm[:, :, None]
            gj = gm[:, None, :]
            beats = (gj > gi) | ((gj == gi) & (g[None, None, :] < g[None, :, None]))
            rank = tl.sum(beats.to(tl.int32), axis=2)
            c = tl.where((rank < TOPK_GROUP)[:, :, None], c, float("-inf"))
        wv = tl.zeros([BT, K_PAD], dtype=tl.float32)
        for r in tl.static_range(K if STEPS == 2 else 1):
            m = tl.max(tl.max(c, axis=2), axis=1)
            wv = tl.where(kk[None, :] == r, m[:, None], wv)
            c = tl.where(c == m[:, None, None], float("-inf"), c)
    omask = rmask[:, None] & (kk < K)[None, :]
    out = rows.to(tl.int64)[:, None] * K + kk[None, :]
    tl.store(ids_ptr + out, wv.to(tl.int32, bitcast=True), mask=omask)
    tl.store(w_ptr + out, wv, mask=omask)


#: Routing skeleton levels (``_route_steps`` STEPS): name and what it does.
ROUTE_STEPS = {0: ("route_load_store", "load logits + bias, one row sum, store k weights + k ids"),
               1: ("route_group_stage", "+ one max per group, group rank, one expert max"),
               2: ("route_topk_chain", "+ k rounds of max-and-remove (the minimum dependent chain)")}
#: Registered moe_grouped_topk workloads (latency bar: 3x the launch floor).
ROUTING = ["dsv3_decode_t256", "dsv3_step_t2048", "kimi_k2_decode_t512"]
#: ``--dry-run`` stand-ins (CPU interpreter): a grouped and a one-group smoke workload.
ROUTING_DRY = ["smoke_t7_e32_g4_k4", "smoke_t5_e48_g1_k6"]


def route_call(args: list, steps: int, bt: int, warps: int):
    """``call(i)`` of :func:`_route_steps` on input set ``args[i]`` (the task's ``run`` arguments)
    at ``bt`` rows per program and ``warps`` warps (the expert's autotuned choice)."""
    outs = []
    for a in args:
        T, E = a[0].shape
        k = int(a[2])
        outs.append((torch.empty((T, k), dtype=torch.float32, device=a[0].device),
                     torch.empty((T, k), dtype=torch.int32, device=a[0].device)))
    T, E = args[0][0].shape
    G, k, tg = int(args[0][3]), int(args[0][2]), int(args[0][4])
    meta = dict(E=E, G=G, GSZ=E // G, G_PAD=triton.next_power_of_2(G), GSZ_PAD=triton.next_power_of_2(E // G),
                TOPK_GROUP=tg, K=k, K_PAD=triton.next_power_of_2(k), BT=bt, STEPS=steps)

    def call(i: int):
        w, ids = outs[i]
        _route_steps[(triton.cdiv(T, bt),)](args[i][0], args[i][1], w, ids, T, num_warps=warps, num_stages=1, **meta)
        return w, ids

    call.outputs = outs  # type: ignore[attr-defined]
    return call


def routing_compile_calls() -> dict[str, tuple[str, object]]:
    """The routing skeletons at every config of the moe expert's autotuner on empty tensors of
    the registered shapes (compile-only)."""
    from d2kbench.tasks import load_task
    from d2kbench.tasks.loader import import_file

    task = load_task("moe_grouped_topk")
    expert = import_file(task.resolve_solution("expert"))
    calls: dict[str, tuple[str, object]] = {}
    for wid in ROUTING:
        wl = task.spec.workload(wid)
        ax, par = wl.axes, wl.values()
        args = [torch.empty((int(ax["T"]), int(ax["E"])), dtype=torch.float32), torch.empty(int(ax["E"])),
                int(ax["k"]), int(ax["G"]), int(par["topk_group"]), float(par["scale"])]
        for cfg in expert._CONFIGS:
            for steps, (kind, what) in ROUTE_STEPS.items():
                call = route_call([args], steps, cfg.kwargs["BT"], cfg.num_warps)
                calls[f"{kind}:{wid}:{cfg.kwargs['BT']}x{cfg.num_warps}"] = (what, call)
    return calls


def expert_config(expert) -> tuple[int, int]:
    """(rows per program, warps) the moe expert's autotuner picked (after a call on this GPU),
    else its interpreter tile (4 rows, 1 warp)."""
    cfg = getattr(expert._grouped_topk_tuned, "best_config", None)
    return (cfg.kwargs["BT"], cfg.num_warps) if cfg is not None else (4, 1)


def routing_rows(device: str, sweep: bool = False, timer=None, workloads: list[str] | None = None,
                 base: bool = True) -> list[dict]:
    """Per registered moe_grouped_topk workload, on the task's own inputs (``make_inputs``, the
    worker's rotation: enough sets for 3x the L2, at most 4): the expert and the three
    :data:`ROUTE_STEPS` skeletons at the expert's tuned grid; with ``sweep`` also the load+store
    and the chain at every config of the expert's autotuner (the best one reported).
    ``timer(call, n_sets) -> (median_ms, mean_ms)``; rows as :func:`measure`'s; ``workloads``:
    other workload ids than :data:`ROUTING`; ``base`` False: the sweep rows only."""
    from d2kbench.checking.inputs import args_nbytes, make_args
    from d2kbench.tasks import load_task
    from d2kbench.tasks.loader import import_file

    task = load_task("moe_grouped_topk")
    ref = task.reference_module()
    expert = import_file(task.resolve_solution("expert"))
    l2 = torch.cuda.get_device_properties(0).L2_cache_size if device == "cuda" else 50 << 20
    rows = []
    for wid in workloads or ROUTING:
        wl = task.spec.workload(wid)
        first = make_args(ref, task.spec, wl, 1000, device)
        n_sets = int(min(4, max(1, -(-3 * l2 // max(1, args_nbytes(first))))))
        sets = [first] + [make_args(ref, task.spec, wl, 1000 + s, device) for s in range(1, n_sets)]
        name = f"moe_grouped_topk/{wid}"
        if not base:
            sweep_rows(rows, expert, sets, n_sets, name, timer)
            continue
        med, mean = timer(lambda i, sets=sets: expert.run(*sets[i]), n_sets)   # autotunes first
        bt, warps = expert_config(expert)
        rows.append({"n": None, "skeleton": f"expert:{name}", "what": f"the expert's run() ({bt} rows x {warps} warps)",
                     "median_ms": med, "mean_ms": mean})
        grid = f"{-(-int(wl.axes['T']) // bt)} programs x {bt} rows, {warps} warps"
        for steps, (kind, what) in ROUTE_STEPS.items():
            med, mean = timer(route_call(sets, steps, bt, warps), n_sets)
            rows.append({"n": None, "skeleton": f"{kind}:{name}", "what": f"{grid}: {what}", "median_ms": med,
                         "mean_ms": mean})
        if sweep:
            sweep_rows(rows, expert, sets, n_sets, name, timer)
    return rows


def sweep_rows(rows: list[dict], expert, sets: list, n_sets: int, name: str, timer) -> None:
    """Append the best time of the load+store and of the top-k chain skeleton over every config
    of the moe expert's autotuner (rows per program, warps)."""
    for steps in (0, 2):
        best = None
        for cfg in expert._CONFIGS:
            b, w = cfg.kwargs["BT"], cfg.num_warps
            med, mean = timer(route_call(sets, steps, b, w), n_sets)
            if best is None or med < best[0]:
                best = (med, mean, b, w)
        assert best is not None
        rows.append({"n": None, "skeleton": f"{ROUTE_STEPS[steps][0]}_best:{name}",
                     "what": f"best of the expert's {len(expert._CONFIGS)} configs ({best[2]} rows x {best[3]} "
                             f"warps): {ROUTE_STEPS[steps][1]}", "median_ms": best[0], "mean_ms": best[1]})


#: Serial chains per registered workload of the recurrent tasks: (task workload, kind, steps,
#: programs, tile width, chunk). Programs and tile widths are the experts' (state_block() of the
#: Gated DeltaNet expert: BV 32 below 264 programs at 64; the SSD expert: 64 state columns);
#: for the random-length batches the steps are the expected longest of 16 random cuts of 32768
#: tokens (32768 H_16 / 16, about 6900 tokens).
CHAINS = [
    ("gated_deltanet_chunk_prefill/qwen3_next_80b_tp1_t16384", "gdn", 256, 1 * 32 * 4, 32, 64),
    ("gated_deltanet_chunk_prefill/qwen3_next_80b_tp1_varlen16", "gdn", 108, 16 * 32 * 2, 64, 64),
    ("gated_deltanet_chunk_prefill/qwen3_next_80b_tp2_4x8192", "gdn", 128, 4 * 16 * 4, 32, 64),
    ("mamba2_ssd_chunk_scan/mamba2_2p7b_t32768", "ssd", 128, 1 * 80 * 2, 64, 256),
    ("mamba2_ssd_chunk_scan/codestral_mamba_7b_8x4096", "ssd", 16, 8 * 128 * 2, 64, 256),
    ("mamba2_ssd_chunk_scan/nemotron3_super_varlen16", "ssd", 54, 16 * 128 * 2, 64, 128),
]
#: Operand tiles each chain cycles through (L2-resident, like a chunk's W / U / K or x / B rows).
CHAIN_TILES = 16


def chain_calls(device: str) -> dict[str, tuple[str, object]]:
    """The serial-chain skeletons of :data:`CHAINS` as ``name -> (what it stands for, call(i))``."""
    g = torch.Generator(device="cpu").manual_seed(0)
    calls = {}
    for wid, kind, steps, programs, width, chunk in CHAINS:
        if kind == "gdn":
            K = 128
            w = torch.randn(CHAIN_TILES * chunk * K, generator=g).to(torch.bfloat16).to(device) * 0.01
            u = torch.randn(CHAIN_TILES * chunk * width, generator=g).to(torch.bfloat16).to(device)
            k = torch.randn(CHAIN_TILES * chunk * K, generator=g).to(torch.bfloat16).to(device) * 0.01
            out = torch.empty(programs * K * width, dtype=torch.float32, device=device)
            call = (lambda i, w=w, u=u, k=k, out=out, steps=steps, programs=programs, width=width, chunk=chunk:  # noqa: E731 - loop values bound as defaults
                    _gdn_chain[(programs,)](w, u, k, out, steps, K=128, BV=width, BT=chunk, TILES=CHAIN_TILES,
                                            num_warps=4, num_stages=2))
            what = f"{programs} programs x {steps} chunk steps: V' = U - W S, S = g S + K^T V' (K 128, BV {width})"
        else:
            P = 64
            x = torch.randn(CHAIN_TILES * chunk * P, generator=g).to(torch.bfloat16).to(device)
            b = torch.randn(CHAIN_TILES * chunk * width, generator=g).to(torch.bfloat16).to(device) * 0.01
            out = torch.empty(programs * P * width, dtype=torch.float32, device=device)
            call = (lambda i, x=x, b=b, out=out, steps=steps, programs=programs, width=width, chunk=chunk:  # noqa: E731 - loop values bound as defaults
                    _ssd_chain[(programs,)](x, b, out, steps, P=64, BN=width, Q=chunk, TILES=CHAIN_TILES,
                                            num_warps=8, num_stages=2))
            what = f"{programs} programs x {steps} chunk steps: S = a S + x^T B (P 64, Q {chunk}, BN {width})"
        calls[f"{kind}_state_chain:{wid}"] = (what, call)
    return calls


def skeleton_calls(n: int, experts: int, device: str, sms: int) -> dict[str, tuple[str, object]]:
    """The skeletons as ``name -> (what it stands for, call(i))`` on ``device`` buffers."""
    e_pad = triton.next_power_of_2(experts)
    n_pad = triton.next_power_of_2(n)
    chunk = triton.next_power_of_2(triton.cdiv(n, sms))
    progs = triton.cdiv(n, chunk)
    g = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, experts, (n,), generator=g, dtype=torch.int32).to(device)
    row = 128                                          # bf16 elements: 256 B, a Hkv x D = 128 row
    src = torch.randn(WIDE_PROGRAMS, row, generator=g).to(torch.bfloat16).to(device)
    slots = torch.randperm(4096, generator=g)[:WIDE_PROGRAMS].to(device)
    dst = torch.empty(4096 * row, dtype=torch.bfloat16, device=device)
    wide = torch.empty(WIDE_PROGRAMS * 256, dtype=torch.int8, device=device)
    cnt = torch.zeros(e_pad, dtype=torch.int32, device=device)
    arrive = torch.zeros(1, dtype=torch.int32, device=device)
    out = torch.empty(max(n_pad, progs * chunk), dtype=torch.int32, device=device)
    rows = torch.empty(progs * e_pad, dtype=torch.int32, device=device)
    rows_out = torch.empty_like(rows)
    calls = {
        "wide_store": (f"{WIDE_PROGRAMS} one-warp programs store 256 B each",
                       lambda i: _wide_store[(WIDE_PROGRAMS,)](wide, ROW=256, num_warps=1)),
        "load_store": (f"{WIDE_PROGRAMS} one-warp programs: load slot + 256 B row, store at slot",
                       lambda i: _load_store[(WIDE_PROGRAMS,)](src, slots, dst, ROW=row, num_warps=1)),
        "two_launch": (f"{progs} programs x {chunk} ids: histogram rows; 2nd launch reads them",
                       lambda i: (_hist_rows[(progs,)](ids, rows, n, CHUNK=chunk, E=e_pad, num_warps=8),
                                  _read_rows[(progs,)](rows, rows_out, E=e_pad, num_warps=4))),
        "grid_barrier": (f"{progs} programs x {chunk} ids: histogram, vector atomic, barrier, store",
                         lambda i: _grid_barrier[(progs,)](ids, cnt, arrive, out, n, CHUNK=chunk, E=e_pad,
                                                           num_warps=8)),
    }
    if n <= 8192:
        calls["cta_atomic_rank"] = (f"1 program x {n} ids: per-id atomic rank, store at rank",
                                    lambda i: _cta_atomic_rank[(1,)](ids, cnt, out, n, N_PAD=n_pad,
                                                                     OUT_MASK=n_pad - 1, num_warps=8))
    return calls


def measure(ids_list: list[int], experts: int, chains: bool = False, routing: bool = False, sweep: bool = False,
            dry_run: bool = False, sweep_only: bool = False) -> dict:
    """Graph-timed per-call median (ms) of every skeleton; GPU only (``dry_run``: the routing
    rows' host logic on the CPU interpreter, every call run once and reported as 1 us).

    Raises:
        RuntimeError: no GPU.
    """
    from d2kbench.harness import timing
    from d2kbench.harness.env import fingerprint
    from d2kbench.harness.launch_floor import launch_floor_ms

    if dry_run:
        def dry_timer(call, n_sets):
            for i in range(n_sets):
                call(i)
            return 1e-3, 1e-3
        rows = routing_rows("cpu", sweep, dry_timer, ROUTING_DRY, base=not sweep_only)
        for r in rows:
            r["x_floor"] = r["median_ms"] / 1e-3
        return {"environment": fingerprint("cpu"), "experts": experts, "launch_floor_ms": 1e-3, "rows": rows,
                "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if not torch.cuda.is_available():
        raise RuntimeError("the skeletons are timed on a GPU")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    floor = launch_floor_ms("graph")
    rows = [{"n": None, "skeleton": "floor", "what": "1 program stores one float (the launch floor)",
             "median_ms": floor, "mean_ms": floor}]
    done: set[str] = set()
    for n in ids_list:
        for name, (what, call) in skeleton_calls(n, experts, "cuda", sms).items():
            size_free = name in ("wide_store", "load_store")
            if size_free and name in done:
                continue
            done.add(name)
            st = timing.time_graph(call, 1, min_samples=20, target_ms=200.0)
            rows.append({"n": None if size_free else n, "skeleton": name, "what": what,
                         "median_ms": st.median_ms, "mean_ms": st.mean_ms,
                         "calls_per_sample": st.calls_per_sample})
    if routing:
        def timer(call, n_sets):
            st = timing.time_graph(call, n_sets, warmup_ms=50.0, min_samples=20, target_ms=100.0)
            return st.median_ms, st.mean_ms
        rows += routing_rows("cuda", sweep, timer, base=not sweep_only)
    for name, (what, call) in (chain_calls("cuda").items() if chains else []):
        st = timing.time_graph(call, 1, min_samples=20, target_ms=200.0)
        rows.append({"n": None, "skeleton": name, "what": what, "median_ms": st.median_ms, "mean_ms": st.mean_ms,
                     "calls_per_sample": st.calls_per_sample})
    for r in rows:
        r["x_floor"] = r["median_ms"] / floor
    return {"environment": fingerprint("cuda"), "experts": experts,
            "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "launch_floor_ms": floor, "rows": rows}


def markdown(res: dict) -> str:
    """The measurement as a markdown table (us per call and multiples of the launch floor)."""
    env = res["environment"]
    lines = [f"# Latency skeletons ({env.get('gpu')}, driver {env.get('driver')}, torch {env.get('torch')}, "
             f"triton {env.get('triton')}, {res['time_utc']})", "",
             "Written by `devtools/latency_skeletons.py`. Graph-timed per-call medians (the harness's "
             "timer, >= 64 calls per replay). A skeleton does only its design's dependent memory steps; "
             f"its time bounds every design with that chain from below. E = {res['experts']} bins.", "",
             "| skeleton | n ids | what it does | us per call | x launch floor |", "|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['skeleton']} | {r['n'] if r['n'] is not None else '-'} | {r['what']} | "
                     f"{r['median_ms'] * 1e3:.2f} | {r['x_floor']:.2f} |")
    return "\n".join(lines) + "\n"


def compile_only(ids_list: list[int], experts: int, chains: bool = False, routing: bool = False) -> int:
    """Compile every skeleton for sm_90 without a GPU (devtools/compile_sm90.py's stand-in
    driver); returns the number of failed compiles. ``routing``: the routing skeletons at every
    config of the moe expert's autotuner, on the registered shapes (empty tensors)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import compile_sm90 as c  # noqa: PLC0415 - changes nothing until install()

    c.install()
    failed = 0
    groups = [(n, skeleton_calls(n, experts, "cpu", c.H200_SMS)) for n in ids_list]
    if chains:
        groups.append(("-", chain_calls("cpu")))
    if routing:
        groups.append(("-", routing_compile_calls()))
    for n, calls in groups:
        for name, (_, call) in calls.items():
            c.LAUNCHES.clear()
            call(0)
            for rec in c.LAUNCHES:
                failed += "error" in rec
                status = rec.get("error") or "ok, " + ", ".join(
                    f"{k} {v}" for k, v in c._resources(rec["compiled"]).items() if k in ("reg", "shared", "stack"))
                print(f"n={n} {name}: {rec['kernel']} grid {rec['grid']}: {status[:400]}")
    return failed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ids", type=int, nargs="*", default=[2048, 131072, 262144], help="none: no id skeletons")
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    ap.add_argument("--chains", action="store_true", help="also the recurrent tasks' serial chunk chains")
    ap.add_argument("--routing", action="store_true", help="also the moe_grouped_topk routing skeletons")
    ap.add_argument("--sweep", action="store_true", help="routing: also every config of the expert's autotuner")
    ap.add_argument("--sweep-only", action="store_true", help="routing: the config sweep rows only")
    ap.add_argument("--dry-run", action="store_true", help="routing rows' host logic on the CPU (TRITON_INTERPRET=1)")
    ap.add_argument("--compile-only", action="store_true")
    a = ap.parse_args()
    if a.compile_only:
        return 1 if compile_only(a.ids, a.experts, a.chains, a.routing) else 0
    res = measure(a.ids, a.experts, a.chains, a.routing or a.sweep_only, a.sweep, a.dry_run, a.sweep_only)
    text = markdown(res)
    print(text)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    if a.markdown:
        Path(a.markdown).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
