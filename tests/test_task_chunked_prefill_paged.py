"""chunked_prefill_paged: the task validates; the registered workloads follow their model configs
and their mixed lengths give exactly the SOL formulas' work; the metadata (pages, slots, NaN
poison) of every scheme; the expert's device-built cost-sorted work list; expert and
straightforward pass through the harness (integrity included) on CPU smoke workloads; classic
bugs of the attention and of the fused cache write fail; the alternatives' gathers and masks
match the reference on the CPU; the tolerance probes separate.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import packed_attention as packed
import pytest
import torch

import d2kbench
from d2kbench.checking.checks import bit_pattern
from d2kbench.checking.inputs import clone_args
from d2kbench.harness.evaluate import Options, evaluate
from d2kbench.harness.validate import validate_task
from d2kbench.results import Status
from d2kbench.tasks import load_task
from d2kbench.tasks.formula import evaluate_formula
from d2kbench.tasks.loader import import_file

TASK = "chunked_prefill_paged"
#: Positions of the caches in the argument list.
KC, VC = 4, 5


def _task():
    return load_task(TASK)


def _args(w, seed=3):
    return packed.task_args(_task(), w, seed)


def test_task_validates():
    assert validate_task(TASK) == []


def test_registered_workloads_follow_model_configs():
    w = {x.id: x.axes for x in _task().spec.workloads if not x.correctness_only}
    assert len(w) == 3
    heads = {k: (a["Hq"], a["Hkv"], a["D"], a["BS"]) for k, a in w.items()}
    assert heads == {"llama31_8b_mixed_step": (32, 8, 128, 16), "qwen3_32b_two_chunks": (64, 8, 128, 16),
                     "qwen3_235b_a22b_tp8_n16": (64 // 8, 1, 128, 16)}   # 4 KV heads replicated under TP8


def _hand_counts(ql, ctx, a):
    """(tensor-core FLOPs, minimal bytes) of one call counted request by request."""
    ql, ctx = ql.double(), ctx.double()
    pairs = float((ql * ctx + ql * (ql + 1) / 2).sum())
    flops = 4 * a["D"] * a["Hq"] * pairs
    c = float(ctx.sum())
    T, N = a["T"], a["N"]
    nbytes = (4 * a["Hkv"] * a["D"] * c + 4 * T * a["Hq"] * a["D"] + 8 * T * a["Hkv"] * a["D"] + 8 * T + 8 * N
              + 4 * (c + T) / a["BS"])
    return flops, nbytes


def test_mixed_lengths_give_the_sol_formulas_exactly():
    """The registered lengths: NP prefill chunks and ND decodes with antithetic contexts, a pure
    prefill and the longest context in every batch, contexts mid-page; the request-by-request
    counts equal the formulas of task.yaml for every seed (the SOL is exact); the order and the
    lengths change with the seed."""
    task = _task()
    ref = task.reference_module()
    floor = task.spec.sol.variants["paged_extend"]
    sol_ms = {}
    for w in task.spec.workloads:
        if w.correctness_only:
            continue
        a = w.axes
        draws = []
        for seed in (1, 2):
            ql, ctx = ref.make_lengths(w.values(), seed)
            assert int(ql.sum()) == a["T"] and len(ql) == a["N"] and int(ql.max()) == a["QMAX"]
            assert int(ctx.max()) == a["CMAX"] and int(ctx.min()) == 0
            assert 0 in ctx[ql > 1].tolist()                     # a fresh prompt (empty prefix) in every batch
            flops, nbytes = _hand_counts(ql, ctx, a)
            assert evaluate_formula(floor.tc_flops, a) == pytest.approx(flops, rel=1e-12)
            assert evaluate_formula(floor.bytes, a) == pytest.approx(nbytes, rel=1e-12)
            draws.append((ql.tolist(), ctx.tolist()))
        if a["N"] > 2:
            assert draws[0] != draws[1]
            assert any(c % a["BS"] for c in draws[0][1])        # contexts end mid-page
        sol_ms[w.id] = evaluate_formula(floor.tc_flops, a) / 790e12 * 1e3
        assert evaluate_formula(floor.bytes, a) / 4.3e12 * 1e3 < sol_ms[w.id] / 3   # tensor-core bound
    assert sol_ms == pytest.approx({"llama31_8b_mixed_step": 1.934, "qwen3_32b_two_chunks": 2.958,
                                    "qwen3_235b_a22b_tp8_n16": 1.435}, abs=1e-3)
    with pytest.raises(ValueError, match="multiple of QMAX"):
        ref.make_lengths({"T": 100, "N": 7, "QMAX": 20, "CMAX": 64, "BS": 16}, 1)


@pytest.mark.parametrize("wid", ["llama31_8b_mixed_step", "adv_edge_lengths_n40", "adv_decode_only_n64",
                                 "smoke_t130_n8_h6x2_d16_bs8_edge", "smoke_decode_t8_h8x1_d16"])
def test_pages_and_slots_of_every_scheme(wid):
    """Every new token's slot is its absolute position's slot in its request's pages; context
    slots, new slots and the pages padding the table rows are disjoint; chunk and context
    lengths stay within the host bounds; the edge scheme has empty prefixes, prefixes ending
    mid-page and one-token chunks."""
    task = _task()
    ref = task.reference_module()
    w = task.spec.workload(wid)
    a = w.axes
    meta = ref.make_metadata(w.values(), 11)
    ql, ctx, table, slots, valid = (meta[k] for k in ("q_lens", "context_lens", "block_tables", "slot_mapping", "valid"))
    BS = a["BS"]
    assert int(ql.max()) <= a["QMAX"] and int(ctx.max()) <= a["CMAX"] and int(ql.min()) >= 1
    want, pad_pages = [], set()
    for i in range(a["N"]):
        pos = int(ctx[i]) + torch.arange(int(ql[i]))
        want.append(table[i, pos // BS] * BS + pos % BS)
        n = -(-(int(ctx[i]) + int(ql[i])) // BS)
        pad_pages |= set(table[i, n:].tolist())
    cu = meta["cu_seqlens_q"]
    for i in range(a["N"]):
        assert torch.equal(slots[int(cu[i]):int(cu[i + 1])], want[i])
    assert len(set(slots.tolist())) == a["T"] and not valid[slots].any()
    assert int(valid.sum()) == int(ctx.sum())
    used_pages = set((slots // BS).tolist()) | set((valid.nonzero().flatten() // BS).tolist())
    assert not (pad_pages & used_pages)
    if w.params.get("lens") == "edge":
        c = ctx.tolist()
        assert 0 in c and any(x % BS for x in c) and 1 in ql.tolist()


def test_poison_before_the_call():
    """make_inputs: NaN at every new token's slot and every slot without a context token, finite
    context slots; the host bounds are the workload's axes."""
    task = _task()
    for wid in ("smoke_t44_n6_h4x2_d32_mixed", "smoke_t130_n8_h6x2_d16_bs8_edge"):
        a = dict(zip([x.name for x in task.spec.args], _args(wid, seed=4)))
        meta = task.reference_module().make_metadata(task.spec.workload(wid).values(), 4)
        for name in ("k_cache", "v_cache"):
            flat = a[name].view(-1, *a[name].shape[2:])
            assert torch.isnan(flat[a["slot_mapping"]]).all()
            assert torch.isfinite(flat[meta["valid"]]).all() and torch.isnan(flat[~meta["valid"]]).all()
        w = task.spec.workload(wid).axes
        assert (a["max_seqlen_q"], a["max_context_len"]) == (w["QMAX"], w["CMAX"])


def _expert_module(name="chunked_prefill_expert_under_test"):
    return import_file(_task().root / "solutions" / "expert.py", name=name)


def test_work_list_holds_every_item_once_sorted_by_cost():
    """The two pre-kernels (interpreter): every (request, tile) exactly once; prefill tiles sorted
    by cost (context + the tile's last position) largest first, ties in layout order;
    decode-sized requests as one item each (tile -1), sorted alike and spread evenly between the
    prefill tiles (decode item r after floor((r + 1) nb / (ns + 1)) of them); the slots past the
    total empty; more requests than one step of the count kernel and several sort programs."""
    ex = _expert_module()
    for seed, decode_share in ((0, 0.5), (1, 0.0), (2, 1.0), (3, 0.9)):
        gen = torch.Generator().manual_seed(seed)
        N, P, SMALL_Q = 150, 16, 4
        ql = torch.where(torch.rand(N, generator=gen) < decode_share, torch.randint(1, SMALL_Q + 1, (N,), generator=gen),
                         torch.randint(SMALL_Q + 1, 120, (N,), generator=gen))
        ctx = torch.randint(0, 300, (N,), generator=gen)
        cu = packed.cu_seqlens(ql)
        T = int(cu[-1])
        n_slots = -(-T // P) + N
        work = torch.full((5, n_slots), -7, dtype=torch.int32)
        ex._count_kernel[(1,)](cu, ctx.to(torch.int32), work[0], work[1], work[2], N, n_slots, P=P, SMALL_Q=SMALL_Q,
                               RB=ex.COUNT_BLOCK)
        ex._rank_kernel[(-(-n_slots // ex.RANK_ROWS),)](work[0], work[1], work[2], work[3], work[4], n_slots,
                                                         ROWS=ex.RANK_ROWS, COLS=ex.RANK_COLS)
        items = []                                                  # (cost, request, tile) in layout order
        for r in range(N):
            q, c = int(ql[r]), int(ctx[r])
            items += [(c + q, r, -1)] if q <= SMALL_Q else [(c + min((t + 1) * P, q), r, t) for t in range(-(-q // P))]
        big = sorted((k for k in range(len(items)) if items[k][2] >= 0), key=lambda k: (-items[k][0], k))
        small = sorted((k for k in range(len(items)) if items[k][2] < 0), key=lambda k: (-items[k][0], k))
        nb, ns = len(big), len(small)
        order, b = [], 0
        for r, k in enumerate(small):
            while b < (r + 1) * nb // (ns + 1):
                order.append(big[b])
                b += 1
            order.append(k)
        order += big[b:]
        want = [items[k][1:] for k in order]
        assert list(zip(work[3, :len(want)].tolist(), work[4, :len(want)].tolist())) == want, seed
        assert (work[3, len(want):] == -1).all()


@pytest.mark.parametrize("solution, workloads", [
    ("expert", ["smoke_t44_n6_h4x2_d32_mixed", "smoke_t130_n8_h6x2_d16_bs8_edge"]),
    ("straightforward", ["smoke_t44_n6_h4x2_d32_mixed"]),
])
def test_solutions_pass_smoke_workloads(solution, workloads, shipped):
    # the session's shared evaluation with every defence on (tests/shipped.py): the mixed batch,
    # and for the expert the edge lengths (page size 8, groups of 3: both code paths)
    results = shipped.results(TASK, solution, workloads)
    for r in results:
        assert r.status is Status.OK, (r.workload, r.cause, [v.rule for v in r.violations])
        assert r.checks and all(c.passed for c in r.checks)
        assert any(c.name.startswith("state:k_cache") and c.passed for c in r.checks)


def _variant(tmp_path, base: str, old: str, new: str):
    return packed.solution_variant(_task(), base, old, new, tmp_path / f"chunked_{base}_bug.py")


def test_dropped_cache_write_fails_through_the_harness(tmp_path):
    """The expert with its fused write masked off everywhere: the output is right (the chunk is
    read from k_new) but the state check of the cache fails."""
    bug = _variant(tmp_path, "expert", "own = (kn >= start_m) & (kn < end_m)", "own = (kn >= start_m) & (kn < start_m)")
    task = _task()
    ev = evaluate(task, bug, [task.spec.workload("smoke_decode_t8_h8x1_d16")], device="cpu", baseline=None,
                  options=Options(cpu_samples=1, check_calls=1))
    r = ev.candidate.results[0]
    assert r.status is Status.INCORRECT and "state:k_cache" in r.cause, r.cause


#: (test id, solution, text replaced, replacement): each breaks the output or the cache on the
#: smoke inputs (run in this process).
BUGS = [
    # every request reads its context through request 0's table row
    ("context_through_row_0", "expert", "bt_row = BT + req.to(tl.int64) * stride_bt", "bt_row = BT + 0 * stride_bt"),
    # the full context tiles skipped (only the partial last page is read)
    ("context_tiles_skipped", "expert", "for start_n in tl.range(0, full_n, BLOCK_N", "for start_n in tl.range(0, 0, BLOCK_N"),
    # one future key of the chunk leaks into each row
    ("one_future_key", "expert", "qk = tl.where(pos[:, None] >= kn[None, :], qk",
     "qk = tl.where(pos[:, None] + 1 >= kn[None, :], qk"),
    # the partial context tile neither masks its loads nor its scores (NaN slots past ctx)
    ("partial_context_tile_unmasked", "expert",
     "k = tl.load(KC + row[:, None] + offs_d[None, :], mask=kok[:, None], other=0.0)\n        qk = tl.dot(q, tl.trans(k))\n"
     "        qk = tl.where(kok[None, :], qk, float(\"-inf\"))",
     "k = tl.load(KC + row[:, None] + offs_d[None, :], mask=kok[:, None] | True)\n        qk = tl.dot(q, tl.trans(k))"),
    # the fused write stores every KV head's rows into head 0
    ("cache_write_to_head_0", "expert", "dst = (slot // BS) * stride_cp + (slot % BS) * stride_cs + head_off",
     "dst = (slot // BS) * stride_cp + (slot % BS) * stride_cs"),
    # the fused write sends every token of a tile to the slot of the tile's first token (in
    # bounds: a slot shifted past the pool's end would write out of bounds in this process)
    ("cache_write_to_first_slot", "expert", "slot = tl.load(SLOT + q0_64 + kn, mask=own, other=0)",
     "slot = tl.load(SLOT + q0_64 + start_m + 0 * kn, mask=own, other=0)"),
    # the straightforward port forgets to shift the causal diagonal by the context
    ("straightforward_diagonal_not_shifted", "straightforward", "qk = tl.where((ctx + offs_m[:, None] >= kn[None, :])",
     "qk = tl.where((offs_m[:, None] >= kn[None, :])"),
]


def _broken(mod, args, ref_module) -> bool:
    ref_args = clone_args(args)
    o_ref = ref_module.oracle(*ref_args)
    ref_module.run(*ref_args)                        # the expected caches
    got = clone_args(args)
    o = mod.run(*got)
    bad_o = not torch.isfinite(o).all() or packed.rel_rows(o, o_ref) > 1e-3
    bad_cache = any(not torch.equal(bit_pattern(got[i]), bit_pattern(ref_args[i])) for i in (KC, VC))
    return bad_o or bad_cache


@pytest.mark.parametrize("base, old, new", [b[1:] for b in BUGS], ids=[b[0] for b in BUGS])
def test_classic_bugs_break_the_output_or_the_cache(tmp_path, base, old, new):
    mod = import_file(_variant(tmp_path, base, old, new), name=f"chunked_bug_{base}_{abs(hash(old))}")
    ref = _task().reference_module()
    assert _broken(mod, _args("smoke_t44_n6_h4x2_d32_mixed", seed=5), ref)


def test_alternatives_match_the_reference_on_cpu():
    """flash_varlen_gathered and sdpa_gathered through their CPU paths: the cache write, the
    gathers and the bottom-right causal alignment (output close to the float64 evaluation,
    caches bit-identical to the reference's)."""
    task = _task()
    ref = task.reference_module()
    for w in ("smoke_t44_n6_h4x2_d32_mixed",):
        args = _args(w, seed=9)
        ref_args = clone_args(args)
        o_ref = ref.oracle(*ref_args)
        ref.run(*ref_args)
        for name in ("flash_varlen_gathered", "sdpa_gathered"):
            mod = import_file(task.root / "alternatives" / f"{name}.py", name=f"chunked_alt_{name}")
            got = clone_args(args)
            o = mod.run(*got)
            assert o.shape == args[0].shape and o.dtype == args[0].dtype and o.is_contiguous(), name
            assert packed.rel_rows(o, o_ref) < 1e-3, (w, name, packed.rel_rows(o, o_ref))
            for i in (KC, VC):
                assert torch.equal(bit_pattern(got[i]), bit_pattern(ref_args[i])), (w, name, i)


def test_flashinfer_alternative_names_the_missing_package(monkeypatch):
    packed.assert_names_missing_flashinfer(monkeypatch, _task().root / "alternatives" / "flashinfer_paged.py",
                                    "chunked_alt_flashinfer", _args("smoke_t44_n6_h4x2_d32_mixed"))


def test_tolerance_probes_separate_on_smoke_workloads():
    packed.assert_probes_separate(_task(), ["smoke_t44_n6_h4x2_d32_mixed", "smoke_t130_n8_h6x2_d16_bs8_edge"])


def test_expert_tile_plan_for_the_h200():
    """The GPU tiles (interpreter off): 128 packed rows on 8 warps, 16-row decode items, 64-key
    tiles, a three-stage context pipeline at D = 128 for groups of 1, 4, 5 and 8; a group too
    large for the tiles is refused."""
    ex = packed.import_for_gpu(_task().root / "solutions" / "expert.py", "chunked_prefill_expert_gpu_plan")
    for g in (1, 4, 5, 8):
        cfg = ex.tile_config(128, g)
        assert (cfg["BLOCK_M"], cfg["SMALL_M"], cfg["BLOCK_N"], cfg["CTX_STAGES"], cfg["num_warps"]) == (128, 16, 64, 3, 8)
    with pytest.raises(ValueError, match="too large"):
        ex.tile_config(128, 128)


def _wgmma_refill_races(ttgir: str) -> list[str]:
    """Asynchronous ``warp_group_dot``s whose shared-memory operand slot is refilled by an
    ``async_copy_global_to_local`` in the same loop body before the dot is waited: a WAR race on
    sm_90 (a wgmma reads its shared operands until ``wgmma.wait_group``), invisible to the
    interpreter. Ring-buffer slots are followed through the loops' ``select(i + 1 >= n, 0, i + 1)``
    counters (initial values from the enclosing ``scf.for``); an unresolved slot counts as a race."""
    slots = {m[1]: int(m[2]) for m in re.finditer(r"(%[\w.]+) = ttg.local_alloc : \(\) -> !ttg.memdesc<(\d+)x", ttgir)}
    index = {m[1]: (m[2], m[3]) for m in re.finditer(r"(%[\w.]+) = ttg.memdesc_index (%[\w.]+)\[(%[\w.-]+)\]", ttgir)}
    consts = {m[1]: int(m[2]) for m in re.finditer(r"(%[\w.-]+) = arith.constant (-?\d+) : i32", ttgir)}
    step = {m[1]: m[2] for m in re.finditer(r"(%[\w.]+) = arith.addi (%[\w.]+), %c1_i32 : i32", ttgir)}
    wrap = {m[1]: m[2] for m in re.finditer(r"(%[\w.]+) = arith.select %[\w.]+, %c0_i32, (%[\w.]+) : i32", ttgir)}
    lines = ttgir.splitlines()
    races = []
    for i, line in enumerate(lines):
        dot = re.search(r"(%[\w.]+) = ttng.warp_group_dot (%[\w.]+), (%[\w.]+), .*isAsync = true", line)
        if not dot:
            continue
        init = {}
        for back in range(i, -1, -1):
            loop = re.search(r"scf.for [^\n]*iter_args\(([^)]*)\)", lines[back])
            if loop:
                init = {a: consts[v] for a, v in re.findall(r"(%[\w.]+) = (%[\w.-]+)", loop[1]) if v in consts}
                break

        def first_slot(idx, init=init):
            if idx in consts:
                return consts[idx]
            if idx in wrap and wrap[idx] in step and step[wrap[idx]] in init:
                return init[step[wrap[idx]]] + 1
            return None

        operands = [o for o in dot.groups()[1:] if o in index and index[o][0] in slots]
        depth = 0
        for later in lines[i + 1:]:
            if "warp_group_dot_wait" in later and dot[1] in later:
                break
            depth += later.count("{") - later.count("}")
            if depth < 0:                                   # the end of the loop body
                break
            copy = re.search(r"ttg.async_copy_global_to_local %[\w.]+, (%[\w.]+)", later)
            if not copy or copy[1] not in index:
                continue
            for o in operands:
                (alloc, read), (target, written) = index[o], index[copy[1]]
                a, b = first_slot(read), first_slot(written)
                if alloc == target and (slots[alloc] == 1 or read == written or None in (a, b)
                                        or a % slots[alloc] == b % slots[alloc]):
                    races.append(f"line {i + 1}: {o} ({slots[alloc]} slot(s) of {alloc}) refilled by {copy[1]}")
    return races


_SM90_TTGIR = textwrap.dedent('''
    import sys
    sys.path.insert(0, sys.argv[1])
    from d2kbench.integrity.sm90_aot import install_sm90_driver, record_launches
    install_sm90_driver()  # before the expert's kernels are defined: the interpreter off, target cuda:90
    launches = []
    record_launches(launches)  # every launch compiles for sm_90 and runs nothing
    from d2kbench.checking.inputs import make_args
    from d2kbench.tasks import load_task
    from d2kbench.tasks.loader import import_file
    task = load_task("chunked_prefill_paged")
    ex = import_file(task.root / "solutions" / "expert.py", name="chunked_prefill_expert_sm90")
    ex.run(*make_args(task.reference_module(), task.spec, task.spec.workload(sys.argv[2]), 5, "cpu"))
    errors = [r["error"] for r in launches if "error" in r]
    assert not errors, errors
    (extend,) = {id(r["compiled"]): r["compiled"] for r in launches if r["kernel"] == "_extend_kernel"}.values()
    open(sys.argv[3], "w").write(extend.asm["ttgir"])
''')


def test_expert_sm90_pipeline_never_refills_a_tile_an_async_wgmma_reads(tmp_path):
    """The attention kernel compiled for the H200 (ahead of time, no GPU): no asynchronous wgmma
    reads a shared-memory K/V slot that a prefetch copy refills before the wgmma is waited. The
    fused cache write once reused the chunk loop's K/V tiles; Triton then single-buffered them
    and refilled V under the in-flight P.V wgmma: the H200 failed adv_edge_lengths_n40 (the only
    workload whose chunk loops zero-fill part of a next tile before the chunk ends) while every
    interpreter run passed. The scan itself flags that kernel's pattern (a one-slot V tile
    refilled before the wait)."""
    pytest.importorskip("triton.backends.nvidia")
    bad = """
      %v_136 = ttg.local_alloc : () -> !ttg.memdesc<1x64x128xbf16, #s, #smem, mutable>
      %v_155 = ttg.memdesc_index %v_136[%c0_i32] : !ttg.memdesc<1x64x128xbf16>
      %r:3 = scf.for %i = %c0_i32 to %n step %c64_i32 iter_args(%arg29 = %c-1_i32) -> (i32) : i32 {
        %a = arith.addi %arg29, %c1_i32 : i32
        %b = arith.cmpi sge, %a, %c1_i32 : i32
        %s = arith.select %b, %c0_i32, %a : i32
        %v_181 = ttg.memdesc_index %v_136[%s] : !ttg.memdesc<1x64x128xbf16>
        %acc_200 = ttng.warp_group_dot %p, %v_181, %acc {inputPrecision = 0 : i32, isAsync = true} : x
        %v_220 = ttg.async_copy_global_to_local %ptr, %v_155 mask %m : x
        scf.yield %s : i32
      }"""
    assert len(_wgmma_refill_races("    %c0_i32 = arith.constant 0 : i32\n" + bad)) == 1
    out = tmp_path / "extend.ttgir"
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "cache")}  # the child turns the interpreter off
    src = str(Path(d2kbench.__file__).resolve().parents[1])
    proc = subprocess.run([sys.executable, "-c", _SM90_TTGIR, src, "adv_edge_lengths_n40", str(out)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert out.exists(), proc.stderr[-3000:]
    ttgir = out.read_text()
    assert ttgir.count("isAsync = true") >= 4            # wgmma pipelines were compiled and scanned
    assert _wgmma_refill_races(ttgir) == []
