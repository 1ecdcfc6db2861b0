"""The attention-family tasks (gqa_flash_prefill, paged_decode_gqa, kv_cache_fp8_store):
task files validate, the expert and straightforward solutions pass every check (integrity
included) on CPU smoke workloads under the Triton interpreter, and solutions with the classic
bugs of each task fail.
"""

from __future__ import annotations

import pytest
import torch

from d2kbench.checking.inputs import make_args
from d2kbench.harness.evaluate import Options, evaluate
from d2kbench.harness.validate import validate_task
from d2kbench.tasks import load_task

TASKS = ("gqa_flash_prefill", "paged_decode_gqa", "kv_cache_fp8_store")
#: One timed and one correctness-only smoke workload per task (the interpreter is slow).
SMOKE = {
    "gqa_flash_prefill": ["smoke_b1_s64_h3x1_d16", "smoke_peaky_b1_s40_h2x2_d64"],
    "paged_decode_gqa": ["smoke_b6_h6x1_d16_bs24_edge", "smoke_b4_h4x2_d32_bs16"],
    "kv_cache_fp8_store": ["smoke_t5_h1x64_bs24_decode", "smoke_t8_all_padding"],
}


def _options(task: str) -> Options:
    """Default harness options (integrity on), one CPU timing sample."""
    return Options(cpu_samples=1)


def _evaluate(task_id: str, solution, workloads: list[str]):
    task = load_task(task_id)
    return evaluate(task, solution, [task.spec.workload(w) for w in workloads], device="cpu", baseline=None,
                    options=_options(task_id))


@pytest.mark.parametrize("task_id", TASKS)
def test_task_validates(task_id):
    # kv_cache_fp8_store's torch.compile alternative: test_alternatives.py validates it (a cold
    # compile takes a minute on 2 cores; once is enough)
    assert validate_task(task_id, run_alternatives=task_id != "kv_cache_fp8_store") == []


def test_decode_metadata_of_every_workload():
    """For every workload (registered ones included, CPU metadata only): the page pool fits,
    lengths are in range, registered lengths sum exactly to the SOL formula's total, and the
    generated caches hold finite values exactly at the valid tokens' slots."""
    task = load_task("paged_decode_gqa")
    ref = task.reference_module()
    for w in task.spec.all_workloads():
        B, BS, MAXB = w.axes["B"], w.axes["BS"], w.axes["MAXB"]
        for seed in (1, 2):
            lens, table, valid = ref.make_metadata(w.values(), seed)
            assert int(lens.min()) >= 1 and int(lens.max()) <= MAXB * BS, w.id
            assert int(valid.sum()) == int(lens.sum()), w.id
            assert int(table.max()) < w.axes["NB"] and int(table.min()) >= 0, w.id
            if w.params.get("lens", "uniform") == "uniform" and B % 2 == 0:
                hi = MAXB * BS
                assert int(lens.sum()) * 2 == B * (hi + hi // 4), w.id
    for w in task.spec.smoke_workloads:
        a = dict(zip([x.name for x in task.spec.args], make_args(ref, task.spec, w, 7, "cpu")))
        t = torch.arange(w.axes["MAXB"] * w.axes["BS"])
        ok = t[None, :] < a["seq_lens"].long()[:, None]
        pages = a["block_tables"].long()[:, t // w.axes["BS"]]
        got = a["k_cache"][pages, (t % w.axes["BS"])[None, :].expand_as(pages)]
        assert torch.isfinite(got[ok]).all() and torch.isnan(got[~ok]).all()


def test_cache_store_slots_of_every_workload():
    """Slots are distinct, inside the pool, and padding is 2% (all of it on pad=all workloads)."""
    task = load_task("kv_cache_fp8_store")
    ref = task.reference_module()
    for w in task.spec.all_workloads():
        s = ref.make_slots(w.values(), 3)
        v = s[s >= 0]
        assert s.numel() == w.axes["T"] and v.unique().numel() == v.numel(), w.id
        assert v.numel() == 0 or int(v.max()) < w.axes["NB"] * w.axes["BS"], w.id
        want_pad = w.axes["T"] if w.params.get("pad") == "all" else ref._pad_count(w.axes["T"])
        assert int((s < 0).sum()) == want_pad, w.id


@pytest.mark.parametrize("solution", ["expert", "straightforward"])
@pytest.mark.parametrize("task_id", TASKS)
def test_solutions_pass_smoke_workloads(task_id, solution, shipped):
    # the expert runs both smoke workloads (decode: the split path and the single-pass path);
    # the straightforward port has one code path and runs the first only (the session's shared
    # evaluation with every defence on, tests/shipped.py)
    for r in shipped.results(task_id, solution, SMOKE[task_id] if solution == "expert" else SMOKE[task_id][:1]):
        assert r.status.value == "ok", (r.workload, r.cause, [v.rule for v in r.violations])
        assert r.checks and all(c.passed for c in r.checks)


def _variant(task_id: str, tmp_path, old: str, new: str, base: str = "straightforward"):
    src = (load_task(task_id).root / "solutions" / f"{base}.py").read_text()
    assert old in src, old
    path = tmp_path / f"{task_id}_bug.py"
    path.write_text(src.replace(old, new))
    return path


def test_prefill_causal_off_by_one_fails(tmp_path):
    bug = _variant("gqa_flash_prefill", tmp_path, "(offs_m[:, None] >= kn[None, :])", "(offs_m[:, None] + 1 >= kn[None, :])")
    r = _evaluate("gqa_flash_prefill", bug, ["smoke_b1_s64_h3x1_d16"]).candidate.results[0]
    assert r.status.value == "incorrect" and "o:oracle:rel_fro" in r.cause


def test_decode_unmasked_kv_loads_leak_nan(tmp_path):
    # K loads may stay unmasked (the score mask hides them) but V must not: p = 0 times NaN is NaN.
    # The block-table lookup is unmasked too, so the tail of a sequence's last page is read from
    # that page (NaN slots) rather than from pool page 0, whose contents depend on the seed; the
    # edge workload's lengths (1, 2, 23, 25, 47 tokens in 24-slot pages) always leave such a tail.
    bug = _variant("paged_decode_gqa", tmp_path,
                   "mask=ok[:, None], other=0.0).to(tl.float32)\n        acc = ", ").to(tl.float32)\n        acc = ")
    src = bug.read_text()
    masked_lookup = "tl.load(BT + b * stride_bt + tok // PAGE, mask=ok, other=0)"
    assert masked_lookup in src
    bug.write_text(src.replace(masked_lookup, "tl.load(BT + b * stride_bt + tok // PAGE)"))
    r = _evaluate("paged_decode_gqa", bug, ["smoke_b6_h6x1_d16_bs24_edge"]).candidate.results[0]
    assert r.status.value == "incorrect" and "o:finite" in r.cause, r.cause


def test_cache_store_padding_written_to_slot_zero_fails(tmp_path):
    # the expert's small-batch kernel (the smoke shapes) maps the padding slot -1 to 0 for the
    # address and then stores it anyway: a padding token's row lands in slot 0
    bug = _variant("kv_cache_fp8_store", tmp_path,
                   "slot = tl.where(valid, slot, 0).to(tl.int64)\n    if FLAT:  ",
                   "slot = tl.where(valid, slot, 0).to(tl.int64)\n    valid = valid | (slot == 0)\n    if FLAT:  ",
                   base="expert")
    r = _evaluate("kv_cache_fp8_store", bug, ["smoke_t8_all_padding"]).candidate.results[0]
    assert r.status.value == "incorrect" and "state:key_cache:reference:exact" in r.cause, r.cause
