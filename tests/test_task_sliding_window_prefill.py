"""sliding_window_prefill: the task validates; the registered workloads follow their model
configs (heads, window, sinks, soft-cap, Gemma's query scale); the SOL formulas against hand
counts; the inputs (sinks, binding soft-cap); expert and straightforward pass through the harness
(integrity included) on CPU smoke workloads; classic bugs fail; the alternatives' window
convention, sink folding and layouts match the reference on the CPU; the tolerance probes
separate.
"""

from __future__ import annotations

import math
import sys

import pytest
import torch

from d2kbench.checking.inputs import make_args
from d2kbench.harness.calibrate import calibrate, verdicts
from d2kbench.harness.evaluate import Options, evaluate
from d2kbench.harness.validate import validate_task
from d2kbench.results import Status
from d2kbench.tasks import load_task
from d2kbench.tasks.formula import evaluate_formula
from d2kbench.tasks.loader import import_file

TASK = "sliding_window_prefill"


def _task():
    return load_task(TASK)


def _args(w, seed=3):
    task = _task()
    return make_args(task.reference_module(), task.spec, task.spec.workload(w), seed, "cpu")


def _named(w, seed=3):
    return dict(zip([a.name for a in _task().spec.args], _args(w, seed)))


def _evaluate(solution, workloads):
    task = _task()
    return evaluate(task, solution, [task.spec.workload(w) for w in workloads], device="cpu", baseline=None,
                    options=Options(cpu_samples=1))


def _rel_rows(o, ref):
    return float(((o.double() - ref.double()).norm(dim=-1) / ref.double().norm(dim=-1)).max())


def _lse_err(lse, ref):
    return float(((lse.double() - ref.double()).abs() / (1.0 + ref.double().abs())).max())


def test_task_validates():
    assert validate_task(TASK) == []


def test_registered_workloads_follow_model_configs():
    spec = _task().spec
    w = {x.id: x for x in spec.workloads if not x.correctness_only}
    assert len(w) == 3
    oss, g3, g2 = w["gptoss_120b_sliding_b4_s16384"], w["gemma3_27b_local_s32768"], w["gemma2_9b_local_softcap_b2_s8192"]
    assert {k: oss.axes[k] for k in ("Hq", "Hkv", "D", "W")} == {"Hq": 64, "Hkv": 8, "D": 64, "W": 128}
    assert oss.params == {"sinks": True}
    assert {k: g3.axes[k] for k in ("Hq", "Hkv", "D", "W")} == {"Hq": 32, "Hkv": 16, "D": 128, "W": 1024}
    assert g3.params["query_scale"] == 168 and "softcap" not in g3.params
    assert {k: g2.axes[k] for k in ("Hq", "Hkv", "D", "W")} == {"Hq": 16, "Hkv": 8, "D": 256, "W": 4096}
    assert g2.params["softcap"] == 50.0 and g2.params["query_scale"] == 256 and g2.axes["S"] == 8192


def test_sol_formulas_against_hand_counts():
    """Band pairs counted by brute force on small shapes; the registered SOLs (ms at 790 TFLOP/s,
    4.3 TB/s) and the causal/band work ratios (64x, 16x, 1.33x)."""
    task = _task()
    ref = task.reference_module()
    band, full = task.spec.sol.variants["band"], task.spec.sol.variants["causal_full"]
    for S, W in ((10, 3), (10, 1), (7, 20), (64, 64), (65, 64)):
        i = torch.arange(S)[:, None]
        j = torch.arange(S)[None, :]
        brute = int(((j <= i) & (j > i - W)).sum())
        assert ref.band_pairs(S, W) == brute
        axes = {"B": 2, "S": S, "Hq": 4, "Hkv": 2, "D": 16, "W": W}
        assert evaluate_formula(band.tc_flops, axes) == 4 * 16 * 2 * 4 * brute
    sol = {}
    for w in task.spec.workloads:
        if w.correctness_only:
            continue
        a = w.axes
        ms = max(evaluate_formula(band.tc_flops, a) / 790e12, evaluate_formula(band.bytes, a) / 4.3e12) * 1e3
        sol[w.id] = (round(ms, 3), round(evaluate_formula(full.tc_flops, a) / evaluate_formula(band.tc_flops, a), 2))
    assert sol == {"gptoss_120b_sliding_b4_s16384": (0.285, 64.25), "gemma3_27b_local_s32768": (0.685, 16.25),
                   "gemma2_9b_local_softcap_b2_s8192": (1.044, 1.33)}


def test_inputs_sinks_scale_and_binding_softcap():
    ref = _task().reference_module()
    a = _named("smoke_b2_s70_h4x2_d32_w16_sinks")
    assert torch.isfinite(a["sinks"]).all() and a["sinks"].unique().numel() == 4 and a["window"] == 16
    b = _named("smoke_peaky_b1_s48_h4x1_d16_w8")
    assert torch.isneginf(b["sinks"]).all() and b["softcap"] == 0.0
    g2 = ref.make_inputs({"B": 1, "S": 256, "Hq": 2, "Hkv": 1, "D": 256, "W": 4096, "softcap": 50.0,
                          "query_scale": 256, "logit_std": 12.0}, 1, "cpu")
    assert g2["scale"] == pytest.approx(1 / 16)
    x = torch.einsum("shd,sd->hs", g2["q"][0].float(), g2["k"][0, :, 0].float()) * g2["scale"]   # diagonal scores
    assert 10 < float(x.std()) < 14
    assert float((x.abs() > 25).float().mean()) > 0.02          # the cap changes these by more than 7%
    assert _task().reference_module().make_inputs({"B": 1, "S": 8, "Hq": 1, "Hkv": 1, "D": 16, "W": 2,
                                                   "query_scale": 168}, 1, "cpu")["scale"] == pytest.approx(168 ** -0.5)


@pytest.mark.parametrize("solution, workloads", [
    ("expert", ["smoke_b1_s50_h3x1_d16_w64_softcap"]),
    ("straightforward", ["smoke_b1_s40_h2x2_d64_w1_sinks"]),
])
def test_solutions_pass_smoke_workloads(solution, workloads, shipped):
    # the session's shared evaluation with every defence on (tests/shipped.py)
    for r in shipped.results(TASK, solution, workloads):
        assert r.status is Status.OK, (r.workload, r.cause, [v.rule for v in r.violations])
        assert r.checks and all(c.passed for c in r.checks)


def test_expert_with_sinks_and_edge_tiles_directly():
    """The expert on the sink workloads (the harness run above covers the soft-cap one): a
    16-key window over 70 positions (left-edge, interior and diagonal tiles) and a one-key
    window, within the fp16 tolerances of the sink workloads."""
    task = _task()
    ex = import_file(task.root / "solutions" / "expert.py", name="swa_expert_direct")
    for w in ("smoke_b2_s70_h4x2_d32_w16_sinks", "smoke_b1_s40_h2x2_d64_w1_sinks"):
        args = _args(w, seed=12)
        o_ref, lse_ref = task.reference_module().oracle(*args)
        o, lse = ex.run(*args)
        assert _rel_rows(o, o_ref) < 1e-3 and _lse_err(lse, lse_ref) < 1e-4, w


def _variant(tmp_path, base: str, old: str, new: str):
    src = (_task().root / "solutions" / f"{base}.py").read_text()
    assert src.count(old) == 1, old
    path = tmp_path / f"swa_{base}_bug.py"
    path.write_text(src.replace(old, new))
    return path


def test_window_one_key_too_wide_fails_through_the_harness(tmp_path):
    bug = _variant(tmp_path, "expert", "(kn[None, :] > pos[:, None] - W)", "(kn[None, :] >= pos[:, None] - W)")
    r = _evaluate(bug, ["smoke_peaky_b1_s48_h4x1_d16_w8"]).candidate.results[0]
    assert r.status is Status.INCORRECT and "o:" in r.cause, r.cause


#: (test id, solution, text replaced, replacement, smoke workload)
BUGS = [
    # the band starts one key tile late: the first window keys of the block's early rows are lost
    ("band_starts_a_tile_late", "expert", "lo = (lo // BLOCK_N) * BLOCK_N ", "lo = (lo // BLOCK_N + 1) * BLOCK_N ",
     "smoke_b2_s70_h4x2_d32_w16_sinks"),
    # mask only the diagonal tiles: keys left of the window leak in through the edge tiles
    ("edge_tiles_unmasked", "expert", "if (start_n >= band_n) | (start_n < edge_n):", "if start_n >= band_n:",
     "smoke_b2_s70_h4x2_d32_w16_sinks"),
    # the sink left out of the denominator (its running max kept, its sum dropped)
    ("sink_dropped_from_the_sum", "expert", "total = l_i * keep + tl.exp2(sink - m_all)", "total = l_i * keep",
     "smoke_b1_s40_h2x2_d64_w1_sinks"),
    # the cap's tanh applied after the natural-log scaling is lost (cap on base-2 logits)
    ("softcap_in_the_wrong_units", "expert", "s2 = cap_out * (1.0 - 2.0 / (tl.exp2(qk * cap_in) + 1.0))",
     "s2 = cap_out * (1.0 - 2.0 / (tl.exp2(qk * cap_in * 1.4426950408889634) + 1.0))", "smoke_b1_s50_h3x1_d16_w64_softcap"),
    # the straightforward port without the window term (plain causal attention)
    ("straightforward_window_dropped", "straightforward", "& (kn[None, :] > offs_m[:, None] - W)", "",
     "smoke_peaky_b1_s48_h4x1_d16_w8"),
]


@pytest.mark.parametrize("base, old, new, workload", [b[1:] for b in BUGS], ids=[b[0] for b in BUGS])
def test_classic_bugs_break_the_map(tmp_path, base, old, new, workload):
    mod = import_file(_variant(tmp_path, base, old, new), name=f"swa_bug_{base}_{abs(hash(old))}")
    args = _args(workload, seed=5)
    o_ref, lse_ref = _task().reference_module().oracle(*args)
    o, lse = mod.run(*args)
    bad_o = not torch.isfinite(o).all() or _rel_rows(o, o_ref) > 1e-3
    bad_lse = not torch.isfinite(lse).all() or _lse_err(lse, lse_ref) > 1e-4
    assert bad_o or bad_lse


def _alt(name):
    return import_file(_task().root / "alternatives" / f"{name}.py", name=f"swa_alt_{name}")


def test_alternatives_match_the_reference_on_cpu():
    """fa2_window and sdpa_band_mask through their CPU stand-ins (window convention, GQA
    expansion, sink folding, layouts); both refuse a soft-cap with a clear error."""
    ref = _task().reference_module()
    for w in ("smoke_b2_s70_h4x2_d32_w16_sinks", "smoke_b1_s40_h2x2_d64_w1_sinks", "smoke_peaky_b1_s48_h4x1_d16_w8"):
        args = _args(w, seed=9)
        o_ref, lse_ref = ref.oracle(*args)
        for name in ("fa2_window", "sdpa_band_mask"):
            o, lse = _alt(name).run(*args)
            assert o.shape == args[0].shape and o.is_contiguous() and lse.is_contiguous(), name
            assert lse.shape == (args[0].shape[0], args[0].shape[2], args[0].shape[1]) and lse.dtype == torch.float32
            assert _rel_rows(o, o_ref) < 1e-3 and _lse_err(lse, lse_ref) < 1e-4, (w, name)
    capped = _args("smoke_b1_s50_h3x1_d16_w64_softcap")
    for name in ("fa2_window", "sdpa_band_mask"):
        with pytest.raises(ValueError, match="soft-cap"):
            _alt(name).run(*capped)


def test_band_mask_rows_are_aligned_for_the_efficient_kernel():
    """The memory-efficient kernel on the GPU rejects an ``attn_bias`` whose row stride is not a
    multiple of 8 elements (seen on the H200 at S=777); the cached mask keeps S x S values in
    rows padded to that stride."""
    alt = _alt("sdpa_band_mask")
    for S, W in ((777, 128), (70, 16), (64, 8)):
        m = alt._mask(S, W, torch.float16, "cpu")
        assert m.shape == (S, S) and m.stride() == (-(-S // 8) * 8, 1), S
        i = torch.arange(S)[:, None]
        j = torch.arange(S)[None, :]
        assert torch.equal(m == 0, (j <= i) & (j > i - W)), S


def test_flex_alternative_caps_and_masks_on_cpu():
    """flex_attention (uncompiled on CPU: slow, one workload) with the soft-cap score_mod, GQA and
    the causal block mask of a window longer than the sequence."""
    ref = _task().reference_module()
    for w in ("smoke_b1_s50_h3x1_d16_w64_softcap",):
        args = _args(w, seed=4)
        o_ref, lse_ref = ref.oracle(*args)
        o, lse = _alt("flex_window").run(*args)
        assert _rel_rows(o, o_ref) < 1e-3 and _lse_err(lse, lse_ref) < 1e-4, w


def test_flashinfer_alternative_names_the_missing_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    with pytest.raises(RuntimeError, match="flashinfer"):
        _alt("flashinfer_window").run(*_args("smoke_b2_s70_h4x2_d32_w16_sinks"))


def test_tolerance_probes_separate_on_smoke_workloads():
    task = _task()
    res = calibrate(task, [task.spec.workload(w) for w in ("smoke_b2_s70_h4x2_d32_w16_sinks",
                                                          "smoke_b1_s50_h3x1_d16_w64_softcap")], "cpu", calls=1)
    for probe, (expect, accepted, as_expected) in verdicts(res).items():
        assert as_expected, (probe, expect, accepted, [(r.workload, r.errors) for r in res if r.probe == probe])
    assert math.isfinite(min(r.errors.get("o:oracle:rel_fro") or 0.0 for r in res))
