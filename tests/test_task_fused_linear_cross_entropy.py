"""fused_linear_cross_entropy: the task validates; workloads follow the Llama-3 / Qwen3 LM-head
configs; SOL counts match a hand count; the labels hold what the adversarial workloads rely on;
the expert's chunk plan stays within the memory bound; expert and straightforward pass through
the harness; classic bugs fail (one through the harness, the rest against the checks in-process);
the tolerance probes separate on a smoke workload; the Liger alternative names its package.
"""

from __future__ import annotations

import functools
import os

import pytest
from shipped import param

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

TID = "fused_linear_cross_entropy"


@functools.cache
def _task():
    return load_task(TID)


def _evaluate(solution, workload: str):
    t = _task()
    return evaluate(t, solution, [t.spec.workload(workload)], device="cpu", baseline=None,
                    options=Options(cpu_samples=1)).candidate.results[0]


def test_task_validates():
    assert validate_task(TID, run_alternatives=False) == []


def test_workloads_follow_lm_head_configs():
    wl = {w.id: w.axes for w in _task().spec.workloads if not w.correctness_only}
    assert wl == {"llama31_8b_bt8192": {"BT": 8192, "H": 4096, "V": 128256},
                  "qwen3_32b_bt8192": {"BT": 8192, "H": 5120, "V": 151936},
                  "llama31_70b_bt8192": {"BT": 8192, "H": 8192, "V": 128256}}
    for a in wl.values():   # even the bf16 logits exceed the 1 GiB bound by ~2x or more
        assert a["BT"] * a["V"] * 2 > 1.9 * 2 ** 30


def test_sol_counts_match_a_hand_count():
    a = _task().spec.workload("llama31_8b_bt8192").axes
    c = _task().spec.sol.variants["three_products"]
    assert evaluate_formula(c.tc_flops, a) == 3 * 2 * 8192 * 4096 * 128256          # 25.8 TFLOP
    assert evaluate_formula(c.bytes, a) == 2 * 8192 * 4096 * 2 + 128256 * 4096 * (2 + 4) + 8 * 8192


def test_labels_ignored_fraction_and_spans():
    ref = _task().reference_module()
    lab = ref.make_labels({"BT": 20000, "V": 151936}, 3)
    frac = float((lab == ref.IGNORE_INDEX).float().mean())
    assert 0.08 < frac < 0.12 and int(lab.max()) < 151936
    spans = ref.make_labels({"BT": 3000, "V": 151936, "mask": "spans", "ignored": 0.75}, 3)
    ign = (spans == ref.IGNORE_INDEX)
    assert 0.6 < float(ign.float().mean()) < 0.9 and bool((~ign).any())
    runs = int((ign[1:] != ign[:-1]).sum())
    assert runs < 0.2 * 3000                                                         # contiguous spans
    t = _task()
    w = t.spec.workload("smoke_bt40_h32_v700_large_logits")
    a = make_args(ref, t.spec, w, 2, "cpu")
    assert float((a[0].float() @ a[1].float().t()).abs().max()) > 88.7              # exp overflows in fp32


def _gpu_expert():
    saved = os.environ.pop("TRITON_INTERPRET", None)
    try:
        return import_file(_task().root / "solutions" / "expert.py", name="flce_expert_plan")
    finally:
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved


def test_expert_chunks_stay_within_the_memory_bound():
    ex = _gpu_expert()
    for w in _task().spec.workloads:
        BT, V = w.axes["BT"], w.axes["V"]
        c = ex.chunk_rows(BT, V)
        work = c * V * 2 + c * (-(-V // 256)) * 8 + c * 4 + BT * 4                  # e/P, partials, label logits, losses
        assert c & (c - 1) == 0 and work < 2 ** 30, (w.id, c, work)
    assert ex.chunk_rows(8192, 128256) == 2048 and ex.chunk_rows(8192, 151936) == 2048


@pytest.mark.parametrize("solution", [param(TID, s, s, id=s) for s in ("expert", "straightforward")])
def test_solutions_pass_through_the_harness(solution, shipped):
    # the correctness-only smoke workload (both solutions run two chunks there), in the session's
    # shared evaluation with every defence on (tests/shipped.py)
    [r] = shipped.results(TID, solution, ["smoke_bt40_h32_v700_large_logits"])
    assert r.status is Status.OK, (r.cause, [v.rule for v in r.violations])


#: (id, replaced text, replacement, failing check prefix)
BUGS = [
    ("wrong_denominator", "    scale = tl.where(valid, 1.0 / n, 0.0)\n", "    scale = tl.where(valid, 1.0 / V, 0.0)\n",
     "dX"),
    ("target_term_dropped", " - tl.where(cols == lab, scale, 0.0)", "", "dX"),
    ("ignored_rows_contribute", "    scale = tl.where(valid, 1.0 / n, 0.0)\n", "    scale = 1.0 / n\n", "dX"),
    ("no_max_subtraction", "    e = tl.exp2((acc - mx[:, None]) * 1.4426950408889634)\n",
     "    e = tl.exp2(acc * 1.4426950408889634)\n    mx = mx * 0.0\n", "dX:finite"),
    ("second_chunk_overwrites_dw", "    if not FIRST:\n        acc += tl.load", "    if False:\n        acc += tl.load", "dW"),
]


def _bug(tmp_path, bug: str, old: str, new: str):
    src = (_task().root / "solutions" / "expert.py").read_text()
    assert src.count(old) == 1, old
    path = tmp_path / f"flce_{bug}.py"
    path.write_text(src.replace(old, new))
    return path


def test_a_classic_bug_fails_through_the_harness(tmp_path):
    r = _evaluate(_bug(tmp_path, *BUGS[1][:3]), "smoke_bt40_h32_v700_large_logits")
    assert r.status is Status.INCORRECT and ("dX" in r.cause or "dW" in r.cause), r.cause


@pytest.mark.parametrize("bug, old, new, check", [b for i, b in enumerate(BUGS) if i != 1],
                         ids=[b[0] for i, b in enumerate(BUGS) if i != 1])
def test_classic_bugs_fail_the_checks(tmp_path, bug, old, new, check):
    t = _task()
    mod = import_file(_bug(tmp_path, bug, old, new), name=f"flce_bug_{bug}")
    ref = t.reference_module()
    wid = "smoke_bt40_h32_v700_large_logits" if bug == "no_max_subtraction" else "smoke_bt37_h48_v515_spans"
    w = t.spec.workload(wid)
    pristine = make_args(ref, t.spec, w, 13, "cpu")
    args = clone_args(pristine)
    out = mod.run(*args)
    reply = {"outputs": list(out), "types": ["torch.Tensor"] * 3, "exact_tensor": [True] * 3, "subclass": [False] * 3,
             "aliases": [], "container": "tuple"}
    results, _ = check_reply(0, t.spec, w, ref, args, Expected(t, ref, w, pristine), reply)
    failed = [c.name for c in results if not c.passed]
    assert any(n.startswith(check) for n in failed), failed


def test_tolerance_probes_separate_on_a_smoke_workload():
    t = _task()
    res = calibrate(t, [t.spec.workload("smoke_bt40_h32_v700_large_logits"), t.spec.workload("smoke_bt37_h48_v515_spans")],
                    "cpu", calls=1)
    for probe, (expect, accepted, as_expected) in verdicts(res).items():
        assert as_expected, (probe, expect, accepted)


def test_liger_alternative_names_its_package():
    t = _task()
    alt = import_file(t.root / "alternatives" / "liger_flce.py", name="flce_alt_liger")
    try:
        import liger_kernel  # noqa: F401
    except ImportError:
        args = make_args(t.reference_module(), t.spec, t.spec.workload("smoke_bt64_h64_v1000"), 1, "cpu")
        with pytest.raises(ImportError, match="liger"):
            alt.run(*args)
