"""The MoE routing and block-FP8 tasks: moe_grouped_topk and fused_moe_fp8_block.

CPU only (Triton under TRITON_INTERPRET=1 with the harness's sm_90 float conversions): the task
folders validate; the grouped top-k property check accepts every valid answer (any order, any
resolution of ties) and rejects the classic routing bugs; the FP8 tolerance accepts the allowed
numerical variations and rejects wrong scale handling; the FP8 tensor-core FLOPs are counted at
the FP8 rate; expert and straightforward pass the harness on smoke workloads. Real bf16/FP8
speed and the registered-workload tolerances are measured on the H200 (d2k bench).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first triton import

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from d2kbench.checking import checks  # noqa: E402
from d2kbench.harness.validate import validate_task  # noqa: E402
from d2kbench.scoring.sol import MEASURED, sol_ms  # noqa: E402
from d2kbench.tasks import load_task  # noqa: E402
from d2kbench.tasks.loader import import_file  # noqa: E402
from d2kbench.tasks.schema import WorkCounts  # noqa: E402

TASKS = ("moe_grouped_topk", "fused_moe_fp8_block")


@pytest.fixture(scope="module")
def topk_ref():
    return load_task("moe_grouped_topk").reference_module()


@pytest.fixture(scope="module")
def fp8_ref():
    return load_task("fused_moe_fp8_block").reference_module()


@pytest.mark.parametrize("tid", TASKS)
def test_task_validates(tid):
    assert validate_task(tid, run_alternatives=False) == []


def test_registered_workloads_follow_model_configs():
    """DeepSeek-V3 (256 experts, 8 groups keep 4, top-8, x2.5; hidden 7168, moe_intermediate 2048,
    TP-8 shard 256), Kimi-K2 (384 experts, one group, top-8, x2.827) and Qwen3-235B-A22B-FP8
    (hidden 4096, moe_intermediate 1536, 128 experts, top-8)."""
    tk = {w.id: (w.axes, w.params) for w in load_task("moe_grouped_topk").spec.workloads}
    for wid in ("dsv3_decode_t256", "dsv3_step_t2048"):
        axes, params = tk[wid]
        assert (axes["E"], axes["G"], axes["k"], params["topk_group"], params["scale"]) == (256, 8, 8, 4, 2.5)
    axes, params = tk["kimi_k2_decode_t512"]
    assert (axes["E"], axes["G"], axes["k"], params["topk_group"], params["scale"]) == (384, 1, 8, 1, 2.827)
    spec = load_task("fused_moe_fp8_block").spec
    fp = {w.id: w.axes for w in spec.workloads}
    assert fp["qwen3_235b_t64"] == {"T": 64, "H": 4096, "I": 1536, "E": 128, "k": 8}
    assert fp["qwen3_235b_t8192"] == {"T": 8192, "H": 4096, "I": 1536, "E": 128, "k": 8}
    assert fp["dsv3_tp8_t256"] == {"T": 256, "H": 7168, "I": 256, "E": 256, "k": 8}
    assert sum(not w.correctness_only for w in spec.workloads) == 3
    assert sum(not w.correctness_only for w in load_task("moe_grouped_topk").spec.workloads) == 3


# ---- moe_grouped_topk: the property check ---------------------------------------------------------
def _topk_args(ref, variant="normal", T=24, E=64, G=8, k=8, topk_group=4, scale=2.5, seed=0):
    wl = {"T": T, "E": E, "G": G, "k": k, "topk_group": topk_group, "scale": scale, "variant": variant}
    return list(ref.make_inputs(wl, seed, "cpu").values())


def _routing(args, use_bias=True, weights_from_choice=False, mask_value=float("-inf"), extra_group=0,
             renorm=True, scaled=True):
    """grouped_topk with one classic bug switched on (the defaults are the correct operator)."""
    logits, bias, k, G, topk_group, rsf = args
    T, E = logits.shape
    s = logits.sigmoid()
    c = s + bias if use_bias else s.clone()
    if G > 1:
        gs = c.view(T, G, -1).topk(2, dim=-1).values.sum(-1)
        keep = gs.topk(topk_group + extra_group, dim=-1).indices
        mask = torch.zeros(T, G, dtype=torch.bool).scatter_(1, keep, True).repeat_interleave(E // G, dim=1)
        c = c.masked_fill(~mask, mask_value)
    ids = c.topk(k, dim=-1).indices
    w = (s + bias if weights_from_choice else s).gather(1, ids)
    if renorm:
        w = w / w.sum(-1, keepdim=True)
    if scaled:
        w = w * rsf
    return [w.float(), ids.int()]


def test_topk_check_accepts_any_order(topk_ref):
    args = _topk_args(topk_ref)
    w, ids = topk_ref.run(*args)
    assert topk_ref.check(args, [w, ids]) == (True, 0.0, "")
    perm = torch.stack([torch.randperm(ids.shape[1], generator=torch.Generator().manual_seed(r)) for r in range(ids.shape[0])])
    assert topk_ref.check(args, [w.gather(1, perm), ids.gather(1, perm)])[0]
    swapped = ids.gather(1, perm)   # weights no longer at their ids
    assert not topk_ref.check(args, [w, swapped], "topk_weights")[0]


def test_topk_check_accepts_either_side_of_an_exact_tie(topk_ref):
    """Two experts with the same choice score at the selection boundary: both answers pass."""
    args = _topk_args(topk_ref, G=1, E=16, k=2, topk_group=1, T=1)
    logits, bias = args[0], args[1]
    logits[0] = torch.linspace(-3, 3, 16)
    logits[0, 3] = logits[0, 14]   # experts 14 and 3 tie for the second place behind 15
    bias.zero_()
    s = logits[0].sigmoid().double()
    for second in (14, 3):
        ids = torch.tensor([[15, second]], dtype=torch.int32)
        w = (s[ids[0].long()] / s[ids[0].long()].sum() * args[5]).float()[None]
        assert topk_ref.check(args, [w, ids])[0]
    ids = torch.tensor([[15, 13]], dtype=torch.int32)
    w = (s[ids[0].long()] / s[ids[0].long()].sum() * args[5]).float()[None]
    assert not topk_ref.check(args, [w, ids], "topk_ids")[0]


@pytest.mark.parametrize("variant,bug,output", [
    ("bias_flip", dict(use_bias=False), "topk_ids"),             # bias ignored in the choice
    ("normal", dict(weights_from_choice=True), "topk_weights"),  # weights from s + bias
    ("negative", dict(mask_value=0.0), "topk_ids"),              # dropped groups scored 0, not -inf
    ("normal", dict(extra_group=1), "topk_ids"),                 # one surviving group too many
    ("normal", dict(renorm=False), "topk_weights"),
    ("normal", dict(scaled=False), "topk_weights"),
])
def test_topk_check_rejects_classic_bugs(topk_ref, variant, bug, output):
    args = _topk_args(topk_ref, variant=variant, T=64)
    assert topk_ref.check(args, _routing(args))[0]
    ok, bad, detail = topk_ref.check(args, _routing(args, **bug), output)
    assert not ok and bad > 0, detail


@pytest.mark.parametrize("solution", ["expert", "straightforward"])
def test_topk_solutions_break_exact_ties_like_the_reference(topk_ref, solution):
    """On exact ties both solutions pick the reference's experts (lower index first), so the
    harness's sensitivity check (output must move when the reference's moves) holds."""
    mod = import_file(load_task("moe_grouped_topk").root / "solutions" / f"{solution}.py")
    args = _topk_args(topk_ref, variant="ties", T=16, E=64, G=8)
    w_ref, ids_ref = topk_ref.run(*args)
    w, ids = mod.run(*args)
    assert torch.equal(ids.sort(dim=1).values, ids_ref.sort(dim=1).values)
    assert topk_ref.check(args, [w, ids])[0]


def test_topk_check_rejects_repeated_and_out_of_range_ids(topk_ref):
    args = _topk_args(topk_ref)
    w, ids = topk_ref.run(*args)
    dup = ids.clone()
    dup[0, 1] = dup[0, 0]
    assert not topk_ref.check(args, [w, dup], "topk_ids")[0]
    oob = ids.clone()
    oob[2, 0] = 64
    assert not topk_ref.check(args, [w, oob])[0]


def test_topk_make_inputs_variants(topk_ref):
    neg = _topk_args(topk_ref, variant="negative")
    assert float((neg[0].sigmoid() + neg[1]).max()) < 0            # every choice score negative
    ties = _topk_args(topk_ref, variant="ties")
    assert float(ties[1].abs().max()) == 0.0 and ties[0].unique().numel() <= 17
    flip = _topk_args(topk_ref, variant="bias_flip")
    assert float(flip[1].std()) > 0.5
    assert all(isinstance(v, int) for v in (flip[2], flip[3], flip[4])) and isinstance(flip[5], float)


_to_key = import_file(load_task("moe_grouped_topk").root / "solutions" / "expert.py")._to_key


@triton.jit
def _keys(c_ptr, out_ptr, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(out_ptr + o, _to_key(tl.load(c_ptr + o), o, N))


def test_topk_expert_keys_order_like_floats():
    """The packed key orders by score (negative scores included), then by the lower index."""
    c = torch.tensor([-1.5, -0.25, -0.0, 0.0, 1e-30, 0.5, 0.5, 2.0], dtype=torch.float32)
    out = torch.empty(8, dtype=torch.int64)
    _keys[(1,)](c, out, N=8)
    order = out.argsort(descending=True).tolist()
    assert order == [7, 5, 6, 4, 3, 2, 1, 0]   # ties (5, 6): lower index first


# ---- fused_moe_fp8_block: tolerance and work counts -----------------------------------------------
_calib = import_file(load_task("fused_moe_fp8_block").root / "calibration.py")
_fp8_moe = _calib.variant


def _passes(task, out, exp):
    dim = ["T", "H"].index
    return all(checks.compare(0, "out", t, out, exp, dim).passed for t in task.spec.outputs[0].checks)


@pytest.mark.parametrize("wl", [{"T": 12, "H": 512, "I": 256, "E": 4, "k": 2},
                                {"T": 6, "H": 1024, "I": 384, "E": 3, "k": 3, "x": "outliers"}])
def test_fp8_tolerance_accepts_allowed_variations_and_rejects_scale_bugs(fp8_ref, wl):
    task = load_task("fused_moe_fp8_block")
    args = list(fp8_ref.make_inputs(wl, 1, "cpu").values())
    exp = fp8_ref.run(*args)
    for name, ok in _calib.ALLOWED.items():
        assert _passes(task, _fp8_moe(args, **ok), exp), name
    for name, bug in _calib.BUGS.items():
        assert not _passes(task, _fp8_moe(args, **bug), exp), name


def test_fp8_smoke_tolerance_still_rejects_scale_bugs(fp8_ref):
    """The looser smoke-shape checks accept the allowed variations and reject a wrong block scale."""
    task = load_task("fused_moe_fp8_block")
    wl = task.spec.workload("smoke_t5_h256_i128_e4_k2")
    tols = wl.checks_for("out", task.spec.outputs[0].checks)
    args = list(fp8_ref.make_inputs(wl.values(), 2, "cpu").values())
    exp = fp8_ref.run(*args)

    def passes(out):
        return all(checks.compare(0, "out", t, out, exp, ["T", "H"].index).passed for t in tols)

    assert passes(_fp8_moe(args, h_bf16=True, recip=True))
    for bug in (dict(kb0_scale=True), dict(swap=True), dict(no_weight=True)):
        assert not passes(_fp8_moe(args, **bug)), bug


def test_fp8_make_inputs_blocks_and_scales(fp8_ref):
    wl = {"T": 4, "H": 256, "I": 128, "E": 3, "k": 2}
    a = fp8_ref.make_inputs(wl, 0, "cpu")
    assert a["w13"].dtype == torch.float8_e4m3fn and a["w13_scale"].shape == (3, 2, 2)
    assert a["w2_scale"].shape == (3, 2, 1) and a["x"].dtype == torch.bfloat16
    s = a["w13_scale"]
    assert float(s.max() / s.min()) > 4          # block magnitudes differ: a wrong block's scale shows
    codes = a["w13"].float().view(3, 2, 128, 2, 128).abs().amax(dim=(2, 4))
    assert torch.all(codes == 448)               # every block uses the full e4m3 range (s = amax / 448)
    deq = fp8_ref.dequant_block(a["w13"][0], s[0])
    assert deq.shape == (256, 256) and torch.isfinite(deq).all()
    with pytest.raises(ValueError, match="multiples of 128"):
        fp8_ref.make_inputs({**wl, "I": 100}, 0, "cpu")


def test_fp8_flops_count_at_the_fp8_rate():
    """tc_precision: fp8 selects the FP8 peak (the schema default keeps the bf16 rate)."""
    ceil = MEASURED["H200"]
    axes = {"n": 10 ** 12}
    bf16_ms, _ = sol_ms(WorkCounts(tc_flops="n"), axes, ceil)
    fp8_ms, bind = sol_ms(WorkCounts(tc_flops="n", tc_precision="fp8"), axes, ceil)
    assert bind == "tensor_core" and bf16_ms == pytest.approx(1e3 / ceil.bf16_tflops)
    assert fp8_ms == pytest.approx(1e3 / ceil.fp8_tflops)
    spec = load_task("fused_moe_fp8_block").spec
    floor = spec.sol.counts(spec.sol.floor)
    ms, bind = sol_ms(floor, spec.workload("qwen3_235b_t8192").axes, ceil)
    assert bind == "tensor_core" and ms == pytest.approx(6 * 8192 * 8 * 4096 * 1536 / 1267e12 * 1e3)
    ms, bind = sol_ms(floor, spec.workload("qwen3_235b_t64").axes, ceil)
    assert bind == "memory" and 0.52 < ms < 0.58   # about 126 active experts x 18.9 MB of FP8 weights
    ms, bind = sol_ms(floor, spec.workload("dsv3_tp8_t256").axes, ceil)
    assert bind == "memory" and 0.31 < ms < 0.35   # all 256 experts x 5.5 MB


def test_fp8_expert_picks_regime_tiles():
    ex = import_file(load_task("fused_moe_fp8_block").root / "solutions" / "expert.py")
    assert ex.regime(64, 128, 8) == (16, True)        # decode: about 4 tokens per active expert
    assert ex.regime(256, 256, 8) == (16, True)       # TP-8 decode: 8 per expert
    assert ex.regime(8192, 128, 8) == (64, False)     # prefill: 512 per expert


# ---- every solution through the harness on smoke workloads ----------------------------------------
SMOKE = {
    "moe_grouped_topk": ["smoke_t33_e64_g8_k8_ties", "smoke_t5_e48_g1_k6"],
    "fused_moe_fp8_block": ["smoke_t3_h128_i128_e2_k2", "smoke_t50_h128_i128_e2_k1"],
}


@pytest.mark.parametrize("tid", TASKS)
def test_expert_and_straightforward_pass_smoke(tid, shipped):
    # each as the candidate of the session's shared evaluation, every defence on (tests/shipped.py)
    for solution in ("expert", "straightforward"):
        for r in shipped.results(tid, solution, SMOKE[tid]):
            assert r.status.value == "ok", (solution, r.workload, r.cause, [v.rule for v in r.violations])
