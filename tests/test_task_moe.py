"""The MoE / quantisation tasks: moe_align_block_size, fused_moe_bf16, per_token_group_quant_fp8.

CPU only (Triton under TRITON_INTERPRET=1): the task folders validate; the property check of
the align outputs accepts every valid order and rejects broken ones; the expert schedules
(one program, one launch with the grid barrier run by one program, two launches) agree with
the check; the tolerances accept valid variants and reject wrong ones; expert and
straightforward pass the harness on smoke workloads (their FP8 casts are Triton's own, exact
under the interpreter through d2kbench.harness.interpreter_numerics). Real bf16/FP8 numerics and speed are measured on the H200 by
`bash tools/h200-results.sh tasks` (results/h200/tasks/).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first triton import

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from d2kbench.checking import checks  # noqa: E402
from d2kbench.harness.validate import validate_task  # noqa: E402
from d2kbench.tasks import load_task  # noqa: E402
from d2kbench.tasks.loader import import_file  # noqa: E402

TASKS = ("moe_align_block_size", "fused_moe_bf16", "per_token_group_quant_fp8")


@pytest.fixture(scope="module")
def align():
    return load_task("moe_align_block_size")


@pytest.fixture(scope="module")
def align_ref(align):
    return align.reference_module()


@pytest.mark.parametrize("tid", TASKS)
def test_task_validates(tid):
    # torch.compile alternatives (the harness's one compile_reference file for every task): a cold
    # compile takes minutes on 2 cores (fused_moe_bf16's five smoke shapes: 225 s), so the suite
    # runs that path once, in test_alternatives.py (per_token_group_quant_fp8, kv_cache_fp8_store)
    assert validate_task(tid, run_alternatives=False) == []


def test_registered_workloads_follow_model_configs():
    """Shapes of the public configs (hidden size, expert intermediate size, experts, top-k)."""
    qwen3_30b, mixtral = {"H": 2048, "I": 768, "E": 128, "k": 8}, {"H": 4096, "I": 14336, "E": 8, "k": 2}
    moe = {w.id: w.axes for w in load_task("fused_moe_bf16").spec.workloads}
    assert moe["qwen3_30b_a3b_t1"] == {"T": 1, **qwen3_30b} and moe["qwen3_30b_a3b_t8192"] == {"T": 8192, **qwen3_30b}
    assert moe["mixtral_8x7b_t16"] == {"T": 16, **mixtral} and moe["mixtral_8x7b_t4096"] == {"T": 4096, **mixtral}
    assert moe["adv_qwen3_235b_a22b_t3"] == {"T": 3, "H": 4096, "I": 1536, "E": 128, "k": 8}
    al = {w.id: (w.axes["k"], w.axes["E"]) for w in load_task("moe_align_block_size").spec.workloads}
    assert al["dsv3_t16k_b64"] == (8, 256) and al["qwen3_30b_a3b_t32k_b64"] == (8, 128)
    assert al["mixtral_8x7b_t64k_b128"] == (2, 8) and al["adv_kimi_k2_t4k_b32_skewed"] == (8, 384)
    q = {w.id: w.axes for w in load_task("per_token_group_quant_fp8").spec.workloads}
    assert q["dsv3_hidden_m16k"]["K"] == 7168 and q["qwen3_235b_a22b_m32k"]["K"] == 4096
    assert q["dsv3_moe_down_in_m64k_col"]["K"] == 2048 and all(a["GS"] == 128 for a in q.values())


# ---- moe_align_block_size: the property check ---------------------------------------------------
_shapes = st.tuples(st.integers(1, 40), st.integers(1, 4), st.integers(2, 20), st.sampled_from([1, 2, 4, 16]),
                    st.sampled_from(["uniform", "skewed"]), st.integers(0, 2**31 - 1))


def _inputs(ref, T, k, E, B, routing, seed):
    k = min(k, E - (E // 6 if routing == "skewed" else 0))
    return list(ref.make_inputs({"T": T, "k": k, "E": E, "B": B, "routing": routing}, seed, "cpu").values())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_shapes, st.randoms(use_true_random=False))
def test_align_check_accepts_any_order_and_rejects_breakage(align_ref, shape, rnd):
    ref = align_ref
    args = _inputs(ref, *shape)
    sorted_ids, eids, ntpp = ref.run(*args)
    n, total = args[0].numel(), int(ntpp)
    assert ref.check(args, [sorted_ids, eids, ntpp]) == (True, 0.0, "")
    # any permutation inside each segment (padding included) is valid; so is garbage past the total
    ends = torch.cumsum(torch.bincount(eids[: total // args[1]].long() if total else torch.zeros(0, dtype=torch.long),
                                       minlength=args[2]) * args[1], 0)
    perm = sorted_ids.clone()
    lo = 0
    for hi in ends.tolist():
        idx = torch.arange(lo, hi)
        perm[idx] = sorted_ids[idx[torch.randperm(len(idx), generator=torch.Generator().manual_seed(rnd.randint(0, 99)))]]
        lo = hi
    perm[total:] = -7
    eids2 = eids.clone()
    eids2[total // args[1]:] = 12345
    assert ref.check(args, [perm, eids2, ntpp])[0]
    # breakage: a wrong count, a sentinel that is not n, a dropped assignment, a wrong block owner
    assert not ref.check(args, [sorted_ids, eids, ntpp + args[1]], "num_tokens_post_padded")[0]
    pad = (sorted_ids[:total] == n).nonzero().flatten()
    if len(pad):
        bad = sorted_ids.clone()
        bad[pad[0]] = n + 1
        assert not ref.check(args, [bad, eids, ntpp], "sorted_token_ids")[0]
    bad = sorted_ids.clone()
    first_valid = int((sorted_ids[:total] < n).nonzero()[0])
    bad[first_valid] = n
    assert not ref.check(args, [bad, eids, ntpp], "sorted_token_ids")[0]
    if total // args[1] >= 1 and args[2] > 1:
        bad = eids.clone()
        bad[0] = (bad[0] + 1) % args[2]
        assert not ref.check(args, [sorted_ids, bad, ntpp], "expert_ids")[0]


def test_align_check_rejects_misplaced_and_poisoned_entries(align_ref):
    ref = align_ref
    args = list(ref.make_inputs({"T": 64, "k": 8, "E": 32, "B": 16, "routing": "skewed"}, 1, "cpu").values())
    s, e, t = ref.run(*args)
    total = int(t)
    swapped = s.clone()
    swapped[[0, total - 1]] = swapped[[total - 1, 0]]  # first and last segment exchange an entry
    ok, bad, detail = ref.check(args, [swapped, e, t], "sorted_token_ids")
    assert not ok and "outside their expert's segment" in detail
    poisoned = s.clone()
    poisoned[poisoned == args[0].numel()] = 2**31 - 1  # unwritten padding (the harness's int poison)
    ok, bad, detail = ref.check(args, [poisoned, e, t], "sorted_token_ids")
    assert not ok and "neither an assignment nor the sentinel" in detail and bad > 0


# ---- moe_align_block_size: the expert's schedules agree with the check --------------------------
@pytest.mark.parametrize("mode,programs", [("single", None), ("fused", 1), ("two_phase", 3)])
@pytest.mark.parametrize("wl", [
    {"T": 5, "k": 2, "E": 4, "B": 4},
    {"T": 300, "k": 3, "E": 24, "B": 8, "routing": "skewed", "empty": 5},
    {"T": 130, "k": 8, "E": 384, "B": 16},  # E not a power of two
])
def test_align_expert_schedules(align, align_ref, mode, programs, wl):
    ex = import_file(align.root / "solutions" / "expert.py")
    args = list(align_ref.make_inputs(wl, 7, "cpu").values())
    outs = ex.align(*args, mode, programs)
    assert align_ref.check(args, list(outs)) == (True, 0.0, "")


# ---- per_token_group_quant_fp8: tolerance ------------------------------------------------------
def test_quant_tolerance_accepts_reciprocal_and_rejects_wrong_rounding():
    task = load_task("per_token_group_quant_fp8")
    ref = task.reference_module()
    tol = task.spec.outputs[0].checks[0]
    x = ref.make_inputs({"M": 256, "K": 2048, "GS": 128}, 3, "cpu")["x"].float().view(256, 16, 128)
    s = x.abs().amax(-1).clamp_min(1e-10) / 448
    exp = (x / s[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    recip = (x * (1.0 / s)[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    y = (x / s[..., None]).clamp(-448, 448)
    trunc = (y.view(torch.int32) & ~((1 << 20) - 1)).view(torch.float32).to(torch.float8_e4m3fn)
    bf16_scale = (x / s.bfloat16().float()[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    dim = [0, 1, 2].index
    assert checks.compare(0, "x_q", tol, recip, exp, dim).passed
    assert not checks.compare(0, "x_q", tol, trunc, exp, dim).passed
    assert not checks.compare(0, "x_q", tol, bf16_scale, exp, dim).passed


# ---- fused_moe_bf16: tolerance and tile regimes -------------------------------------------------
def _moe_variant(x, w13, w2, tw, ti, swap=False, fp32_intermediates=False):
    T, H = x.shape
    I = w13.shape[1] // 2
    out = torch.zeros(T, H)
    for t in range(T):
        for j in range(ti.shape[1]):
            e = int(ti[t, j])
            h = x[t].float() @ w13[e].float().T
            if not fp32_intermediates:
                h = h.to(x.dtype).float()
            g, u = (h[I:], h[:I]) if swap else (h[:I], h[I:])
            a = (F.silu(g) * u).to(x.dtype).float()
            out[t] += float(tw[t, j]) * (a @ w2[e].float().T)
    return out.to(x.dtype)


def test_fused_moe_tolerance_accepts_fp32_or_bf16_gemm_outputs_and_rejects_swapped_gate():
    task = load_task("fused_moe_bf16")
    ref = task.reference_module()
    args = list(ref.make_inputs({"T": 8, "H": 512, "I": 256, "E": 8, "k": 2}, 0, "cpu").values())
    exp = ref.run(*args)
    dim = ["T", "H"].index
    for out, ok in ((_moe_variant(*args, fp32_intermediates=True), True), (_moe_variant(*args), True),
                    (_moe_variant(*args, swap=True), False)):
        results = [checks.compare(0, "out", t, out, exp, dim).passed for t in task.spec.outputs[0].checks]
        assert all(results) if ok else not all(results)


def test_fused_moe_expert_picks_regime_tiles(monkeypatch):
    ex = import_file(load_task("fused_moe_bf16").root / "solutions" / "expert.py")
    monkeypatch.setattr(ex, "_INTERPRET", False)
    dec = ex.config_for(1, 2048, 768, 128, 8, 132)
    assert dec.swap and dec.block_m == 16 and dec.bn1 * 2 <= 768 and 8 * (768 // dec.bn1) >= 132
    assert ex.config_for(16, 4096, 14336, 8, 2, 132).swap
    pre = ex.config_for(8192, 2048, 768, 128, 8, 132)
    assert not pre.swap and pre.block_m == 128 and pre.warps == 8
    assert not ex.config_for(4096, 4096, 14336, 8, 2, 132).swap


# ---- every solution through the harness on smoke workloads --------------------------------------
SMOKE = {
    "moe_align_block_size": ["smoke_t5_k2_e4_b4", "smoke_t400_k3_e24_b8_skewed"],
    "per_token_group_quant_fp8": ["smoke_m37_k256_col", "smoke_m9_k1024_col_ue8m0_outliers"],
    "fused_moe_bf16": ["smoke_t1_h64_i48_e8_k4", "smoke_t80_h32_i48_e2_k1"],
}


@pytest.mark.parametrize("tid", TASKS)
def test_expert_and_straightforward_pass_smoke(tid, shipped):
    # each as the candidate of the session's shared evaluation, every defence on (tests/shipped.py)
    for solution in ("expert", "straightforward"):
        for r in shipped.results(tid, solution, SMOKE[tid]):
            assert r.status.value == "ok", (solution, r.workload, r.cause, [v.rule for v in r.violations])
