"""lora_shrink_expand (multi-LoRA SGMV / BGMV): the task validates; workloads follow the Llama-3.1 /
Qwen2.5 configs; the SOL formulas match a hand count; the mappings hold what the SOL and the
adversarial workloads rely on; expert and straightforward pass through the harness; classic
bugs fail (one through the harness, the rest against the task's checks in-process); the
tolerance probes separate on a smoke workload; the alternatives run or name their package.
"""

from __future__ import annotations

import functools

import pytest
import torch

from d2kbench.checking.expected import Expected
from d2kbench.checking.inputs import clone_args, make_args
from d2kbench.checking.verdict import check_reply
from d2kbench.harness.calibrate import calibrate, verdicts
from d2kbench.harness.evaluate import Options, evaluate
from d2kbench.harness.validate import validate_task
from d2kbench.results import Status
from d2kbench.tasks import load_task
from d2kbench.tasks.formula import evaluate_formula
from d2kbench.tasks.loader import import_file

TID = "lora_shrink_expand"


@functools.cache
def _task():
    return load_task(TID)


def test_task_validates():
    assert validate_task(TID, run_alternatives=False) == []


def test_workloads_follow_model_configs():
    wl = {w.id: w for w in _task().spec.workloads if not w.correctness_only}
    assert len(wl) == 3
    q = wl["llama31_8b_qkv_prefill_t8192"]
    assert q.axes["K"] == 4096 and q.params["slices"] == "4096,1024,1024"     # 32 x 128 q, 8 x 128 k / v
    g = wl["llama31_8b_gateup_decode_t256"]
    assert g.axes["K"] == 4096 and g.params["slices"] == "14336,14336"         # intermediate 14336
    d = wl["llama31_70b_down_t2048"]
    assert (d.axes["K"], d.axes["N"], d.axes["S"]) == (28672, 8192, 1)          # 70B intermediate, hidden
    adv = _task().spec.workload("adv_qwen25_05b_qkv_t333_interleaved")
    assert adv.axes["K"] == 896 and adv.params["slices"] == "896,128,128"       # 14 x 64 q, 2 x 64 k / v
    for w in _task().spec.all_workloads():
        ref = _task().reference_module()
        widths = ref.parse_slices(w.params.get("slices", w.axes["N"]), w.axes["N"])
        assert len(widths) == w.axes["S"], w.id
    assert all(_task().spec.timing_for(w).mode == "graph" for w in wl.values())


def test_sol_bytes_match_a_hand_count():
    v = _task().spec.sol.variants
    a = _task().spec.workload("llama31_8b_gateup_decode_t256").axes
    valid = 256 - 256 // 16
    weights = 32 * 2 * 64 * 4096 * 2 + 32 * 28672 * 64 * 2                     # every adapter's A and B once
    hand = valid * 4096 * 2 + weights + valid * 28672 * 2 * 2 + 256 * 4 + 3 * 4
    assert evaluate_formula(v["grouped_min"].bytes, a) == hand
    assert evaluate_formula(v["grouped_min"].tc_flops, a) == 2 * valid * 64 * (2 * 4096 + 28672)
    assert evaluate_formula(v["per_token"].bytes, a) > 6 * hand                 # the weights once per token
    a = _task().spec.workload("llama31_8b_qkv_prefill_t8192").axes
    valid = 8192 - 512
    hand = valid * 4096 * 2 + 8 * 16 * (3 * 4096 + 6144) * 2 + valid * 6144 * 4 + 8192 * 4 + 16
    assert evaluate_formula(v["grouped_min"].bytes, a) == hand


def test_mappings_hold_the_edge_cases():
    ref = _task().reference_module()
    for w in _task().spec.workloads:
        if w.correctness_only:
            continue
        m = ref.make_mapping(w.values(), 3)
        T, L = w.axes["T"], w.axes["L"]
        assert int((m < 0).sum()) == T // 16, w.id                                # as the SOL counts
        assert set(m[m >= 0].tolist()) == set(range(L)), w.id                    # every adapter used
    m = ref.make_mapping(_task().spec.workload("llama31_8b_qkv_prefill_t8192").values(), 5)
    starts = (m[1:] != m[:-1]).nonzero().flatten() + 1
    assert any(int(s) % 16 for s in starts)                                       # unaligned segment boundaries
    assert len(set(m[m >= 0].tolist())) < int((m[1:] != m[:-1]).sum()) + 1       # adapters own several runs
    adv = _task().spec.workload("adv_qwen25_05b_qkv_t333_interleaved").values()
    for seed in range(5):
        m = ref.make_mapping(adv, seed)
        counts = torch.bincount(m[m >= 0].long(), minlength=16)
        assert int(counts[0]) == 1 and int((counts == 0).sum()) >= 3
        assert int((m < 0).sum()) >= 333 // 4 - 1
    assert (ref.make_mapping(_task().spec.workload("adv_llama31_8b_o_t512_one_adapter").values(), 1) == 7).all()
    assert (ref.make_mapping(_task().spec.workload("adv_llama31_8b_qkv_t64_no_adapter").values(), 1) == -1).all()


@pytest.mark.parametrize("solution, workload", [
    ("expert", "smoke_t24_k64_s3_decode"), ("expert", "smoke_t150_k128_s2_segmented"),
    ("straightforward", "smoke_t40_k64_interleaved_singleton")])
def test_solutions_pass_through_the_harness(solution, workload, shipped):
    [r] = shipped.results(TID, solution, [workload])   # the session's shared evaluation (tests/shipped.py)
    assert r.status is Status.OK, (r.cause, [v.rule for v in r.violations])


def _expert():
    saved = __import__("os").environ.pop("TRITON_INTERPRET", None)
    try:
        return import_file(_task().root / "solutions" / "expert.py", name="lora_expert_plan")
    finally:
        if saved is not None:
            __import__("os").environ["TRITON_INTERPRET"] = saved


def test_expert_plans_per_regime_from_shapes():
    ex = _expert()
    dec = ex.config_for(256, 4096, 28672, 64, 32, 2, 132)
    assert dec.bm == 16 and dec.split >= 8                                         # decode: 16-row tiles, split-K
    pre = ex.config_for(8192, 4096, 6144, 16, 8, 3, 132)
    assert pre.bm == 64 and pre.split <= 4                                         # prefill: tall tiles
    down = ex.config_for(2048, 28672, 8192, 32, 4, 1, 132)
    assert down.bm == 64 and down.split >= 8                                      # long K: split even at prefill


def _bug_module(tmp_path, solution: str, old: str, new: str, name: str):
    src = (_task().root / "solutions" / f"{solution}.py").read_text()
    assert src.count(old) == 1, old
    path = tmp_path / f"{name}.py"
    path.write_text(src.replace(old, new))
    return path


#: (id, solution, replaced text, replacement)
BUGS = [
    ("scaling_dropped", "expert", "out = yv.to(tl.float32) + acc * scale", "out = yv.to(tl.float32) + acc"),
    ("y_overwritten", "expert", "out = yv.to(tl.float32) + acc * scale", "out = acc * scale"),
    ("next_adapter_weights", "expert", "b_base = b_ptr + lora.to(tl.int64) * stride_bl",
     "b_base = b_ptr + ((lora + 1) % L).to(tl.int64) * stride_bl"),
    ("no_adapter_clamped_to_0", "expert", "m = tl.load(map_ptr + offs, mask=offs < T, other=-1)",
     "m = tl.maximum(tl.load(map_ptr + offs, mask=offs < T, other=-1), 0)"),
    ("tile_owner_off_by_one", "expert", "lora = tl.sum((tends <= j).to(tl.int32), axis=0)",
     "lora = tl.sum((tends < j).to(tl.int32), axis=0)"),
    ("slice_0_everywhere", "straightforward", "col_slice[:, None] * R + rr[None, :]", "rr[None, :] + 0 * col_slice[:, None]"),
]

#: workloads the in-process bug checks run on (decode interleaved with -1 tokens; three slices)
BUG_WORKLOADS = ["smoke_t24_k64_s3_decode", "smoke_t40_k64_interleaved_singleton"]


def test_a_classic_bug_fails_through_the_harness(tmp_path):
    path = _bug_module(tmp_path, *BUGS[0][1:4], name="bug_scale")
    t = _task()
    r = evaluate(t, path, [t.spec.workload("smoke_t24_k64_s3_decode")], device="cpu", baseline=None,
                 options=Options(cpu_samples=1)).candidate.results[0]
    assert r.status is Status.INCORRECT and "state:y" in r.cause, r.cause


def _failed_checks(mod, workload: str, seed: int) -> list[str]:
    t = _task()
    ref = t.reference_module()
    w = t.spec.workload(workload)
    pristine = make_args(ref, t.spec, w, seed, "cpu")
    args = clone_args(pristine)
    out = mod.run(*args)
    reply = {"outputs": [] if out is None else [out], "types": [], "exact_tensor": [], "subclass": [],
             "aliases": [], "container": type(out).__name__}
    results, _ = check_reply(0, t.spec, w, ref, args, Expected(t, ref, w, pristine), reply)
    return [c.name for c in results if not c.passed]


@pytest.mark.parametrize("bug, solution, old, new", BUGS[1:], ids=[b[0] for b in BUGS[1:]])
def test_classic_bugs_fail_the_checks(tmp_path, bug, solution, old, new):
    """The bug variants against the task's own checks in this process (interpreter): each fails
    the state check of y on at least one of the bug workloads."""
    mod = import_file(_bug_module(tmp_path, solution, old, new, name=f"bug_{bug}"), name=f"lora_bug_{bug}")
    failed: list[str] = []
    for wid in BUG_WORKLOADS:                     # stop at the first workload that catches it
        failed += _failed_checks(mod, wid, 11)
        if any(n.startswith("state:y") for n in failed):
            break
    assert any(n.startswith("state:y") for n in failed), failed


@pytest.mark.parametrize("workload", ["smoke_t70_k128_s3_unaligned_single", "smoke_t9_no_adapter"])
def test_expert_edge_workloads_in_process(workload):
    """The expert on the correctness-only smoke workloads, against the task's checks in this
    process: slice boundaries inside column blocks with one adapter for the whole batch, and a
    batch without adapters (y bit-exact)."""
    mod = import_file(_task().root / "solutions" / "expert.py", name="lora_expert_edges")
    assert _failed_checks(mod, workload, 4) == []


def test_tolerance_probes_separate_on_a_smoke_workload():
    t = _task()
    res = calibrate(t, [t.spec.workload("smoke_t24_k64_s3_decode")], "cpu", calls=1)
    for probe, (expect, accepted, as_expected) in verdicts(res).items():
        assert as_expected, (probe, expect, accepted)


def test_torch_loop_alternative_passes_on_the_cpu():
    t = _task()
    alt = import_file(t.root / "alternatives" / "torch_per_adapter_loop.py", name="lora_alt_torch_loop")
    assert _failed_checks(alt, "smoke_t24_k64_s3_decode", 2) == []


def test_vllm_alternative_names_its_package():
    t = _task()
    alt = import_file(t.root / "alternatives" / "vllm_lora_ops.py", name="lora_alt_vllm")
    try:
        import vllm.lora.ops.triton_ops  # noqa: F401
    except ImportError:
        args = make_args(t.reference_module(), t.spec, t.spec.workload("smoke_t24_k64_s3_decode"), 1, "cpu")
        with pytest.raises(ImportError, match="vllm"):
            alt.run(*args)


def test_expert_zeroes_its_buffers_inside_the_call(monkeypatch):
    """The split-K buffer (FP32 atomics) and the sort's outputs come from torch.empty, which holds
    garbage on the GPU but often zeros on the CPU: with every float buffer the expert allocates
    poisoned with NaN and every int32 buffer with a large value, it still matches, with split-K
    on both sort paths (one launch at T = 24, two launches at T = 150)."""
    import types

    t = _task()
    mod = import_file(t.root / "solutions" / "expert.py", name="lora_expert_poisoned")

    def poisoned(*a, **k):
        out = torch.empty(*a, **k)
        if out.is_floating_point():
            out.fill_(float("nan"))
        elif out.dtype == torch.int32:
            out.fill_(12345)
        return out

    proxy = types.ModuleType("torch_poisoned")
    proxy.__dict__.update(torch.__dict__)
    proxy.empty = poisoned  # type: ignore[attr-defined]
    monkeypatch.setattr(mod, "torch", proxy)
    for wid in ("smoke_t24_k64_s3_decode", "smoke_t150_k128_s2_segmented"):
        cfg = mod.LoraConfig(bm=16, bk=32, split=2, bn=32, warps_s=1, stages_s=1, warps_e=1, stages_e=1)
        split_k = types.SimpleNamespace(run=lambda *a, cfg=cfg: mod.lora_shrink_expand(*a, cfg))
        assert _failed_checks(split_k, wid, 6) == [], wid
