"""The attention decode tasks flash_decode_splitkv, mla_decode_absorbed and cascade_prefix_decode:
task files validate; the registered workloads follow their model configs and their length
schemes sum exactly as the SOL formulas say; the generated caches are NaN exactly where no valid
token is; the expert and straightforward solutions pass every check (integrity included) on CPU
smoke workloads under the Triton interpreter; solutions with the classic bug of each design
fail; the alternatives' layout and merge logic match the reference on the CPU (their CPU
stand-ins); the tolerance probes (calibration.py) are accepted and rejected as intended on the
smoke workloads (the registered bf16 shapes are for the H200: ``d2k calibrate TASK --device cuda``).
"""

from __future__ import annotations

import math
import os
import shutil

import pytest
import torch
import yaml

from d2kbench.checking.inputs import make_args
from d2kbench.harness.calibrate import calibrate, verdicts
from d2kbench.harness.evaluate import Options, evaluate
from d2kbench.harness.validate import validate_task
from d2kbench.results import Status
from d2kbench.tasks import load_task
from d2kbench.tasks.formula import evaluate_formula
from d2kbench.tasks.loader import import_file

TASKS = ("flash_decode_splitkv", "mla_decode_absorbed", "cascade_prefix_decode")
#: Smoke workloads per task for the harness runs (the interpreter is slow): the first exercises the
#: expert's main path, the second an edge path (one chunk, edge lengths, two head blocks).
SMOKE = {
    "flash_decode_splitkv": ["smoke_b2_h4x1_d16_l256", "smoke_b3_h8x2_d64_l32_onechunk"],
    "mla_decode_absorbed": ["smoke_edge_b5_h16_p16", "smoke_b2_h80_two_blocks"],
    "cascade_prefix_decode": ["smoke_edge_n8_h6x1_d16_p21", "smoke_short_prefix_n4_h4x1_d16_p5"],
}


def _evaluate(task, solution, workloads: list[str]):
    task = load_task(task) if isinstance(task, str) else task
    return evaluate(task, solution, [task.spec.workload(w) for w in workloads], device="cpu", baseline=None,
                    options=Options(cpu_samples=1))


# ------------------------------------------------------------------------------------ task files
@pytest.mark.parametrize("task_id", TASKS)
def test_task_validates(task_id):
    # flash_decode_splitkv's torch.compile alternative: the harness's compile_reference path runs
    # once in the suite, in test_alternatives.py (a cold compile takes a minute on 2 cores); the
    # CUDA-only alternatives run on the CPU in test_alternatives_match_the_reference_on_cpu below
    assert validate_task(task_id, run_alternatives=False) == []


def test_registered_workloads_follow_model_configs():
    """Head counts and dims of the public configs; exactly three timed workloads per task."""
    fd = {w.id: w.axes for w in load_task("flash_decode_splitkv").spec.workloads if not w.correctness_only}
    assert fd["llama31_8b_b2_l128k"] == {"B": 2, "Hq": 32, "Hkv": 8, "D": 128, "LMAX": 131072}
    assert fd["llama31_8b_b8_l128k"]["B"] == 8 and fd["qwen3_32b_b4_l128k"] == {"B": 4, "Hq": 64, "Hkv": 8, "D": 128,
                                                                               "LMAX": 131072}
    mla = {w.id: w for w in load_task("mla_decode_absorbed").spec.workloads if not w.correctness_only}
    for w in mla.values():  # DeepSeek-V3 / Kimi-K2 MLA: kv_lora_rank 512, rope 64, nope 128, v 128, FlashMLA page 64
        assert {k: w.axes[k] for k in ("DN", "DR", "DL", "DV", "PS")} == {"DN": 128, "DR": 64, "DL": 512, "DV": 128, "PS": 64}
    assert mla["dsv3_tp8_b64"].axes["H"] == 128 // 8 and mla["dsv3_dp_b64_h128"].axes["H"] == 128
    assert mla["kimi_k2_tp4_b4_l128k"].axes["H"] == 64 // 4 and mla["kimi_k2_tp4_b4_l128k"].params["model"] == "kimi_k2"
    cas = {w.id: w.axes for w in load_task("cascade_prefix_decode").spec.workloads if not w.correctness_only}
    assert (cas["llama31_8b_parallel_n128"]["Hq"], cas["llama31_8b_parallel_n128"]["Hkv"]) == (32, 8)
    assert (cas["qwen3_32b_sysprompt_n64"]["Hq"], cas["qwen3_32b_sysprompt_n64"]["Hkv"]) == (64, 8)
    assert (cas["llama31_70b_tp8_n256"]["Hq"], cas["llama31_70b_tp8_n256"]["Hkv"]) == (64 // 8, 8 // 8)
    assert all(a["BS"] == 16 and a["P"] % a["BS"] == 0 for a in cas.values())
    for tid in TASKS:
        assert sum(not w.correctness_only for w in load_task(tid).spec.workloads) == 3, tid


def test_mla_softmax_scale_is_deepseeks():
    """(nope + rope)^-0.5 x mscale^2 with mscale = 0.1 ln(factor) + 1: 0.1352 (DeepSeek-V3, factor
    40) and 0.1309 (Kimi-K2, factor 32), as the modelling code computes softmax_scale."""
    ref = load_task("mla_decode_absorbed").reference_module()
    dims = {"DN": 128, "DR": 64}
    assert ref.softmax_scale(dims) == pytest.approx(192 ** -0.5 * (0.1 * math.log(40) + 1) ** 2) \
        == pytest.approx(0.1352, abs=1e-4)
    assert ref.softmax_scale({**dims, "model": "kimi_k2"}) == pytest.approx(0.1309, abs=1e-4)


# ------------------------------------------------------------------------- inputs and SOL totals
def test_flash_decode_lengths_sum_as_the_sol_formula():
    task = load_task("flash_decode_splitkv")
    ref = task.reference_module()
    for w in task.spec.all_workloads():
        for seed in (1, 2):
            lens = ref.make_lengths(w.values(), seed)
            assert int(lens.min()) >= 1 and int(lens.max()) <= w.axes["LMAX"], w.id
            if w.params.get("lens", "halving") == "halving":
                total = evaluate_formula("LMAX * (2 - 2 ** (1 - B))", w.axes)
                assert int(lens.sum()) == ref.halving_total(w.axes["B"], w.axes["LMAX"]) == total, w.id
    lens = ref.make_lengths(task.spec.workload("llama31_8b_b8_l128k").values(), 5)
    assert int(lens.max()) // int(lens.min()) >= 64                          # two orders of magnitude apart
    orders = ref.make_lengths(task.spec.workload("adv_orders_b7").values(), 5)
    assert sorted(orders.tolist()) == [1, 7, 100, 1000, 10_000, 100_000, 131_072]


def test_flash_decode_cache_is_nan_exactly_past_the_lengths():
    task = load_task("flash_decode_splitkv")
    ref = task.reference_module()
    for w in task.spec.smoke_workloads:
        a = dict(zip([x.name for x in task.spec.args], make_args(ref, task.spec, w, 3, "cpu")))
        ok = torch.arange(w.axes["LMAX"])[None, :] < a["cache_seqlens"].long()[:, None]
        for name in ("k_cache", "v_cache"):
            assert torch.isfinite(a[name][ok]).all() and torch.isnan(a[name][~ok]).all(), (w.id, name)


def test_mla_metadata_and_lengths():
    """Pages fit, lengths in range, registered totals equal the SOL formula's, NaN exactly at the
    rows that hold no valid token (smoke inputs)."""
    task = load_task("mla_decode_absorbed")
    ref = task.reference_module()
    for w in task.spec.all_workloads():
        lens, table, valid = ref.make_metadata(w.values(), 4)
        cap = w.axes["MAXP"] * w.axes["PS"]
        assert int(lens.min()) >= 1 and int(lens.max()) <= cap and int(table.max()) < w.axes["NP"], w.id
        assert int(valid.sum()) == int(lens.sum()), w.id
        if w.params.get("lens", "uniform") == "uniform" and w.axes["B"] % 2 == 0:
            assert 2 * int(lens.sum()) == w.axes["B"] * (cap // 4 + cap), w.id
    for w in task.spec.smoke_workloads:
        a = dict(zip([x.name for x in task.spec.args], make_args(ref, task.spec, w, 7, "cpu")))
        PS, t = w.axes["PS"], torch.arange(w.axes["MAXP"] * w.axes["PS"])
        rows = a["kv_cache"][a["block_table"].long()[:, t // PS], (t % PS)[None, :]]
        ok = t[None, :] < a["seq_lens"].long()[:, None]
        assert torch.isfinite(rows[ok]).all() and torch.isnan(rows[~ok]).all(), w.id
        assert (a["q_nope"] == 0).all() == (w.params.get("variant") == "rope_only"), w.id


def test_cascade_prefix_is_shared_and_totals_match():
    """The first P // BS table columns agree; tokens below P hold the same K/V in every request
    (also through a request's own page when P ends mid-page); registered totals equal the SOL
    formula's; NaN exactly at the slots that hold no valid token."""
    task = load_task("cascade_prefix_decode")
    ref = task.reference_module()
    for w in task.spec.all_workloads():
        lens, table, valid, _, _ = ref.make_metadata(w.values(), 6)
        P, BS, S = w.axes["P"], w.axes["BS"], ref.suffix_capacity(w.values())
        assert int(lens.min()) >= max(P, 1) and int(lens.max()) <= w.axes["MAXB"] * BS, w.id
        assert (table[:, :P // BS] == table[:1, :P // BS]).all(), w.id
        assert int(valid.sum()) == int(lens.sum()) - (len(lens) - 1) * (P // BS * BS), w.id
        if w.params.get("lens", "uniform") == "uniform":
            assert 2 * (int(lens.sum()) - w.axes["N"] * P) == w.axes["N"] * (S // 4 + S), w.id
    assert any(int(s) == 0 for s in ref.make_metadata(task.spec.workload("adv_empty_suffix_n16").values(), 1)[0] - 4000)
    for w in task.spec.smoke_workloads:
        a = dict(zip([x.name for x in task.spec.args], make_args(ref, task.spec, w, 8, "cpu")))
        BS, t = w.axes["BS"], torch.arange(w.axes["MAXB"] * w.axes["BS"])
        k = a["k_cache"][a["block_tables"].long()[:, t // BS], (t % BS)[None, :]]       # [N, L, Hkv, D]
        ok = t[None, :] < a["seq_lens"].long()[:, None]
        assert torch.isfinite(k[ok]).all() and torch.isnan(k[~ok]).all(), w.id
        P = a["common_prefix_len"]
        assert torch.equal(k[:, :P], k[:1, :P].expand_as(k[:, :P])), w.id


# --------------------------------------------------------------- expert and straightforward pass
@pytest.mark.parametrize("solution", ["expert", "straightforward"])
@pytest.mark.parametrize("task_id", TASKS)
def test_solutions_pass_smoke_workloads(task_id, solution, shipped):
    # the expert runs both smoke workloads (two code paths), the straightforward port the first
    # (the session's shared evaluation with every defence on, tests/shipped.py)
    for r in shipped.results(task_id, solution, SMOKE[task_id] if solution == "expert" else SMOKE[task_id][:1]):
        assert r.status is Status.OK, (r.workload, r.cause, [v.rule for v in r.violations])
        assert r.checks and all(c.passed for c in r.checks)


def _gpu_module(task_id: str):
    """A task's expert imported as the GPU sees it (TRITON_INTERPRET unset while its module-level
    constants are read); only its host-side planning functions are called."""
    saved = os.environ.pop("TRITON_INTERPRET", None)
    try:
        return import_file(load_task(task_id).root / "solutions" / "expert.py", name=f"gpu_plan_{task_id}")
    finally:
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved


def test_expert_plans_at_h200_shapes():
    """The launch plans the experts derive from shapes (132 SMs): enough split-KV chunks for few
    long sequences; about one prefix program per SM; MLA workers per SM and head regime."""
    fd = _gpu_module("flash_decode_splitkv")
    assert fd.plan_split(2, 8, 131072, 132) == 1024 and fd.plan_split(8, 8, 131072, 132) == 2048
    assert fd.plan_split(4, 8, 131072, 132) % fd.SPLIT_ALIGN == 0 and fd.plan_split(1, 1, 300, 132) == 512
    cas = _gpu_module("cascade_prefix_decode")
    for w in load_task("cascade_prefix_decode").spec.workloads:
        if w.correctness_only:   # (the registered prefixes end on a page boundary: P is the shared part)
            continue
        a = w.axes
        npc, pc, nsc, sc = cas.plan(a["N"], a["Hq"], a["Hkv"], a["P"], a["MAXB"] * a["BS"] - a["P"], 132)
        n_pre = a["Hkv"] * npc * math.ceil(a["N"] * a["Hq"] // a["Hkv"] / cas.BLOCK_M)
        assert 100 <= n_pre <= 132 and npc * pc >= a["P"] > (npc - 1) * pc, w.id
        assert nsc * sc >= a["MAXB"] * a["BS"] - a["P"], w.id
    mla = _gpu_module("mla_decode_absorbed")
    assert mla.workers(16, 132) == 264 and mla.workers(128, 132) == 66 and mla.workers(64, 132) == 132


# ------------------------------------------------------------------------ classic bugs must fail
#: (test id, task, solution file, text replaced, replacement, smoke workload, failing check prefix)
BUGS = [
    # the merge reads every chunk slot, also those of chunks past the length that no program wrote
    # (NaN-filled workspace): the validity test is the design's device-side schedule
    ("flash_merge_reads_empty_chunks", "flash_decode_splitkv", "expert", "    c_ok = c < n\n",
     "    c_ok = c < MAX_SPLITS\n", "smoke_b2_h4x1_d16_l256", "o:finite"),
    # the merged LSE left in base 2 (the kernels work in exp2): o is right, lse is not
    ("flash_lse_in_base_2", "flash_decode_splitkv", "expert",
     "tl.store(LSE + row, (m + tl.log2(wsum)) * 0.6931471805599453)", "tl.store(LSE + row, m + tl.log2(wsum))",
     "smoke_b2_h4x1_d16_l256", "lse:reference:allclose"),
    # a score mask alone: the NaN rows past the length reach P V as 0 * NaN
    ("flash_unmasked_value_loads", "flash_decode_splitkv", "straightforward",
     "mask=ok[:, None], other=0.0).to(tl.float32)\n        acc = ", ").to(tl.float32)\n        acc = ",
     "smoke_b2_h4x1_d16_l256", "o:finite"),
    # the shared part rounded up to whole pages: request 0's own last prefix page (its own tokens,
    # or its NaN slots) stands in for every request's
    ("cascade_shared_part_rounded_up", "cascade_prefix_decode", "expert", "    P = int(common_prefix_len) // BS * BS\n",
     "    P = -(-int(common_prefix_len) // BS) * BS\n", "smoke_edge_n8_h6x1_d16_p21", "o:"),
    # the merge reads the suffix slot of a request without suffix tokens (nothing wrote it)
    ("cascade_merge_of_empty_suffix", "cascade_prefix_decode", "expert", "(j - NPC) * SC < suffix",
     "(j - NPC) * SC <= suffix", "smoke_edge_n8_h6x1_d16_p21", "o:finite"),
    # prefix rows flattened over all Hq heads while the tile reads one KV head's keys
    ("cascade_prefix_rows_over_all_heads", "cascade_prefix_decode", "expert",
     "    req = (r // GROUP).to(tl.int64)\n    head = kvh * GROUP + r % GROUP\n",
     "    req = (r // (HKV * GROUP)).to(tl.int64)\n    head = r % (HKV * GROUP)\n", "smoke_n6_h4x2_d32_p40", "o:"),
    # the rotary part of the scores dropped (q_nope = 0 leaves nothing else)
    ("mla_rotary_part_dropped", "mla_decode_absorbed", "expert",
     "s = (tl.dot(ql, tl.trans(c)) + tl.dot(qp, tl.trans(kpe))) * qk_scale", "s = tl.dot(ql, tl.trans(c)) * qk_scale",
     "smoke_rope_only_b3_h4", "o:"),
    # partial slots by worker alone: a worker's second request overwrites the first one's partial
    ("mla_partial_slots_by_worker", "mla_decode_absorbed", "expert", "        part = (w + b64) * H + heads\n",
     "        part = w * H + heads\n", "smoke_edge_b5_h16_p16", "o:"),
    # the decompress port's value rows past the length were never written (NaN-filled workspace)
    ("mla_unmasked_value_loads", "mla_decode_absorbed", "straightforward",
     "                    mask=ok[:, None], other=0.0).to(tl.float32)\n        acc = acc * alpha",
     "                    ).to(tl.float32)\n        acc = acc * alpha", "smoke_edge_b5_h16_p16", "o:finite"),
]


@pytest.mark.parametrize("task_id, base, old, new, workload, check", [b[1:] for b in BUGS], ids=[b[0] for b in BUGS])
def test_classic_bug_fails(tmp_path, task_id, base, old, new, workload, check):
    src = (load_task(task_id).root / "solutions" / f"{base}.py").read_text()
    assert src.count(old) == 1, old
    bug = tmp_path / f"{task_id}_{base}_bug.py"
    bug.write_text(src.replace(old, new))
    r = _evaluate(task_id, bug, [workload]).candidate.results[0]
    assert r.status is Status.INCORRECT and check in r.cause, (r.status, r.cause)


# --------------------------------------------------------------------- alternatives on the CPU
def _on_cpu(tmp_path, task_id: str):
    """A copy of ``task_id`` whose file alternatives also declare the CPU (their CPU stand-in path)."""
    dst = tmp_path / task_id
    shutil.copytree(load_task(task_id).root, dst, ignore=shutil.ignore_patterns("__pycache__"))
    data = yaml.safe_load((dst / "task.yaml").read_text())
    data["alternatives"] = [{**a, "devices": ["cpu", "cuda"]} for a in data["alternatives"] if "file" in a]
    (dst / "task.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return load_task(dst)


@pytest.mark.parametrize("task_id", TASKS)
def test_alternatives_match_the_reference_on_cpu(tmp_path, task_id):
    """The CUDA-only alternatives' packing, gathers, masks and merges, through the harness's checks
    on two smoke workloads, with their CPU stand-ins (the plain paged decode runs as Triton under
    the interpreter)."""
    task = _on_cpu(tmp_path, task_id)
    wls = [task.spec.workload(w) for w in SMOKE[task_id]]
    for alt in task.alternatives():
        ev = evaluate(task, alt, wls, "cpu", None, options=Options(timeout_s=300, time_solutions=False))
        assert [r.status for r in ev.candidate.results] == [Status.OK] * len(wls), \
            (alt, [r.cause for r in ev.candidate.results])


# ---------------------------------------------------------------------------- tolerance probes
@pytest.mark.parametrize("task_id", TASKS)
def test_tolerance_probes_separate_on_smoke_workloads(task_id):
    task = load_task(task_id)
    res = calibrate(task, [task.spec.workload(w) for w in SMOKE[task_id]], "cpu", calls=1)
    for probe, (expect, accepted, as_expected) in verdicts(res).items():
        assert as_expected, (probe, expect, accepted, [(r.workload, r.errors) for r in res if r.probe == probe])
