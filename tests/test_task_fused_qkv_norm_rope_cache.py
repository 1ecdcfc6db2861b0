"""fused_qkv_norm_rope_cache (Qwen3 attention prologue): the task validates; workloads follow the
Qwen3 configs; the SOL formulas match a hand count; the inputs hold what the tolerance and the
adversarial workloads rely on; expert and straightforward pass through the harness; classic bugs
fail (one through the harness, the rest against the reference's checks in-process); the tolerance
probes separate on a smoke workload; the FlashInfer alternative names its missing package.
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

TID = "fused_qkv_norm_rope_cache"


@functools.cache
def _task():
    return load_task(TID)


def _evaluate(solution, workload: str):
    t = _task()
    return evaluate(t, solution, [t.spec.workload(workload)], device="cpu", baseline=None,
                    options=Options(cpu_samples=1)).candidate.results[0]


def test_task_validates():
    assert validate_task(TID, run_alternatives=False) == []


def test_workloads_follow_qwen3_configs():
    wl = {w.id: w for w in _task().spec.workloads if not w.correctness_only}
    assert len(wl) == 3
    assert {k: wl["qwen3_8b_decode_t256"].axes[k] for k in ("Hq", "Hkv", "D")} == {"Hq": 32, "Hkv": 8, "D": 128}
    assert {k: wl["qwen3_32b_prefill_t16384"].axes[k] for k in ("Hq", "Hkv", "D")} == {"Hq": 64, "Hkv": 8, "D": 128}
    assert {k: wl["qwen3_235b_a22b_prefill_t32768"].axes[k] for k in ("Hq", "Hkv")} == {"Hq": 64, "Hkv": 4}
    assert all(w.axes["MAXPOS"] == 40960 and w.axes["BS"] == 16 for w in wl.values())
    assert _task().spec.timing_for(wl["qwen3_8b_decode_t256"]).mode == "graph"
    assert _task().spec.timing_for(wl["qwen3_32b_prefill_t16384"]).mode == "events"
    assert _task().spec.workload("adv_qwen3_14b_t333_padding").axes["Hq"] == 40       # Qwen3-14B


def test_sol_bytes_match_a_hand_count():
    a = _task().spec.workload("qwen3_32b_prefill_t16384").axes
    T, Hq, Hkv, D = a["T"], a["Hq"], a["Hkv"], a["D"]
    valid = T - T // 50
    hand = T * (Hq + 2 * Hkv) * D * 2 + T * Hq * D * 2 + valid * 2 * Hkv * D * 2 + T * D * 4 + T * 16
    v = _task().spec.sol.variants
    assert evaluate_formula(v["fused_min"].bytes, a) == hand
    assert evaluate_formula(v["unfused_steps"].bytes, a) > 1.9 * hand          # the straightforward chain


def test_inputs_table_metadata_and_zero_tokens():
    t = _task()
    ref = t.reference_module()
    table = ref.cos_sin_table(40960, 128)
    p, i = 40959, 0                                   # the fastest frequency at the last position
    assert table[p, i].item() == pytest.approx(torch.tensor(float(p), dtype=torch.float64).cos().item(), abs=1e-6)
    for w in t.spec.all_workloads():
        pos, slots = ref.make_metadata(w.values(), 5)
        ok = slots >= 0
        assert int(pos.min()) >= 0 and int(pos.max()) < w.axes["MAXPOS"], w.id
        assert int(ok.sum()) < w.axes["T"] or w.axes["T"] == 0, w.id             # padding present
        assert len(set(slots[ok].tolist())) == int(ok.sum()), w.id                 # distinct slots
        assert int(slots.max()) < w.axes["NB"] * w.axes["BS"], w.id
    w = t.spec.workload("smoke_t20_h2x2_d16_zero_padding")
    a = dict(zip([x.name for x in t.spec.args], make_args(ref, t.spec, w, 3, "cpu")))
    pad = a["slot_mapping"] < 0
    assert (a["qkv"][pad] == 0).all() and (a["qkv"][~pad] != 0).any()
    assert int(a["positions"][0]) == 0 and int(a["positions"][-1]) == w.axes["MAXPOS"] - 1
    assert torch.isfinite(a["key_cache"].float()).all()                           # finite canaries


@pytest.mark.parametrize("solution, workload", [
    ("expert", "smoke_t20_h2x2_d16_zero_padding"), ("straightforward", "smoke_t6_h4x2_d32_decode")])
def test_solutions_pass_through_the_harness(solution, workload, shipped):
    [r] = shipped.results(TID, solution, [workload])   # the session's shared evaluation (tests/shipped.py)
    assert r.status is Status.OK, (r.cause, [v.rule for v in r.violations])


def test_expert_plans_from_shapes():
    saved = __import__("os").environ.pop("TRITON_INTERPRET", None)
    try:
        ex = import_file(_task().root / "solutions" / "expert.py", name="qkv_expert_plan")
    finally:
        if saved is not None:
            __import__("os").environ["TRITON_INTERPRET"] = saved
    assert ex.plan(256, 32, 8, 128) == (1, 4)           # decode: a token per program
    assert ex.plan(16384, 64, 8, 128) == (1, 8)          # 64 heads: ~10 K values per program
    assert ex.plan(16384, 32, 8, 128)[0] == 2            # 32 heads: two tokens per program


def _bug_module(tmp_path, old: str, new: str, name: str):
    src = (_task().root / "solutions" / "expert.py").read_text()
    assert src.count(old) == 1, old
    path = tmp_path / f"{name}.py"
    path.write_text(src.replace(old, new))
    return path


#: (id, replaced text, replacement, first failing check)
BUGS = [
    ("gain_dropped", "    n1 = x1 * rstd * w1[None, None, :]\n    n2 = x2 * rstd * w2[None, None, :]\n",
     "    n1 = x1 * rstd\n    n2 = x2 * rstd\n", "q_out"),
    ("rotation_sign", "return n1 * c - n2 * s, n2 * c + n1 * s", "return n1 * c + n2 * s, n2 * c - n1 * s", "q_out"),
    ("padding_written", "    smask = kmask & valid[:, None, None]\n", "    smask = kmask\n", "state:"),
    ("eps_dropped", "tl.math.rsqrt(ss / D + eps)", "tl.math.rsqrt(ss / D)", "q_out:finite"),
]


def test_a_classic_bug_fails_through_the_harness(tmp_path):
    path = _bug_module(tmp_path, *BUGS[0][1:3], name="bug_gain")
    r = _evaluate(path, "smoke_t6_h4x2_d32_decode")
    assert r.status is Status.INCORRECT and "q_out" in r.cause, r.cause


@pytest.mark.parametrize("bug, old, new, check", BUGS[1:], ids=[b[0] for b in BUGS[1:]])
def test_classic_bugs_fail_the_checks(tmp_path, bug, old, new, check):
    """The bug variants against the task's own checks in this process (interpreter), on the
    zero-padding smoke workload."""
    t = _task()
    mod = import_file(_bug_module(tmp_path, old, new, name=f"bug_{bug}"), name=f"qkv_bug_{bug}")
    ref = t.reference_module()
    w = t.spec.workload("smoke_t20_h2x2_d16_zero_padding")
    pristine = make_args(ref, t.spec, w, 11, "cpu")
    args = clone_args(pristine)
    out = mod.run(*args)
    reply = {"outputs": [out], "types": ["torch.Tensor"], "exact_tensor": [True], "subclass": [False],
             "aliases": [], "container": "Tensor"}
    results, _ = check_reply(0, t.spec, w, ref, args, Expected(t, ref, w, pristine), reply)
    failed = [c.name for c in results if not c.passed]
    assert any(n.startswith(check) for n in failed), failed


def test_tolerance_probes_separate_on_a_smoke_workload():
    t = _task()
    res = calibrate(t, [t.spec.workload("smoke_t20_h2x2_d16_zero_padding")], "cpu", calls=1)
    for probe, (expect, accepted, as_expected) in verdicts(res).items():
        assert as_expected, (probe, expect, accepted)


def test_flashinfer_alternative_names_its_package():
    t = _task()
    alt = import_file(t.root / "alternatives" / "flashinfer_ops.py", name="qkv_alt_flashinfer")
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        args = make_args(t.reference_module(), t.spec, t.spec.workload("smoke_t6_h4x2_d32_decode"), 1, "cpu")
        with pytest.raises(ImportError, match="flashinfer"):
            alt.run(*args)
