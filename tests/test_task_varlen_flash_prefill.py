"""varlen_flash_prefill: the task validates; the registered workloads follow their model configs
and their ladder lengths give exactly the SOL formula's causal work; the length schemes; the
expert's device-built longest-first tile list; expert and straightforward pass through the
harness (integrity included) on CPU smoke workloads; classic bugs fail; the alternatives' packing
and LSE conversions match the reference on the CPU; the tolerance probes separate.
"""

from __future__ import annotations

import packed_attention as packed
import pytest
import torch

from d2kbench.harness.evaluate import Options, evaluate
from d2kbench.harness.validate import validate_task
from d2kbench.results import Status
from d2kbench.tasks import load_task
from d2kbench.tasks.formula import evaluate_formula
from d2kbench.tasks.loader import import_file

TASK = "varlen_flash_prefill"


def _task():
    return load_task(TASK)


def _args(w, seed=3):
    return packed.task_args(_task(), w, seed)


def _evaluate(solution, workloads):
    task = _task()
    return evaluate(task, solution, [task.spec.workload(w) for w in workloads], device="cpu", baseline=None,
                    options=Options(cpu_samples=1))


def test_task_validates():
    assert validate_task(TASK) == []


def test_registered_workloads_follow_model_configs():
    w = {x.id: x.axes for x in _task().spec.workloads if not x.correctness_only}
    assert len(w) == 3
    assert {k: w["llama31_8b_mixed_n36"][k] for k in ("Hq", "Hkv", "D")} == {"Hq": 32, "Hkv": 8, "D": 128}
    assert {k: w["qwen3_14b_long_n6"][k] for k in ("Hq", "Hkv", "D")} == {"Hq": 40, "Hkv": 8, "D": 128}
    assert {k: w["llama31_70b_tp8_short_n768"][k] for k in ("Hq", "Hkv", "D")} == {"Hq": 64 // 8, "Hkv": 8 // 8, "D": 128}


def test_ladder_lengths_give_the_sol_formula_exactly():
    """The registered lengths: six halving levels of N / 6 sequences, the longest as the
    workload's text says; sum L(L+1)/2 equals the formula in task.yaml for every seed, so the
    SOL (FLOPs at 790 TFLOP/s) is exact; the order changes with the seed."""
    task = _task()
    ref = task.reference_module()
    flops = task.spec.sol.variants["flash_varlen"].tc_flops
    longest = {"llama31_8b_mixed_n36": 4000, "qwen3_14b_long_n6": 8000, "llama31_70b_tp8_short_n768": 992}
    sol_ms = {}
    for w in task.spec.workloads:
        if w.correctness_only:
            continue
        a = w.axes
        orders = []
        for seed in (1, 2):
            lens = ref.make_lengths(w.values(), seed)
            assert int(lens.sum()) == a["T"] and len(lens) == a["N1"] - 1 and int(lens.max()) == longest[w.id]
            assert sorted(set(lens.tolist())) == [longest[w.id] >> k for k in range(5, -1, -1)]
            hand = 4 * a["D"] * a["Hq"] * ref.causal_pairs(lens)
            assert evaluate_formula(flops, a) == pytest.approx(hand, rel=1e-12)
            orders.append(lens.tolist())
        assert orders[0] != orders[1]
        sol_ms[w.id] = evaluate_formula(flops, a) / 790e12 * 1e3
    assert sol_ms == pytest.approx({"llama31_8b_mixed_n36": 1.327, "qwen3_14b_long_n6": 1.106,
                                    "llama31_70b_tp8_short_n768": 0.436}, abs=1e-3)
    # the padded batch does 4.5x-6.7x the causal work
    for w in task.spec.workloads:
        if not w.correctness_only:
            ratio = evaluate_formula(task.spec.sol.variants["padded"].tc_flops, w.axes) / evaluate_formula(flops, w.axes)
            assert 4.4 < ratio < 6.8, (w.id, ratio)


def test_length_schemes_of_every_workload():
    task = _task()
    ref = task.reference_module()
    for w in task.spec.all_workloads():
        lens = ref.make_lengths(w.values(), 7)
        assert int(lens.sum()) == w.axes["T"] and int(lens.min()) >= 1 and len(lens) == w.axes["N1"] - 1, w.id
    edge = ref.make_lengths(task.spec.workload("adv_edge_lengths_n40").values(), 7).tolist()
    assert {1, 2, 63, 64, 65, 127, 128, 129} <= set(edge)
    assert set(ref.make_lengths(task.spec.workload("adv_single_tokens_n512").values(), 7).tolist()) == {1}
    a = dict(zip([x.name for x in task.spec.args], _args("smoke_t150_n5_h4x2_d32_random")))
    cu = a["cu_seqlens"]
    assert cu.dtype == torch.int32 and int(cu[0]) == 0 and int(cu[-1]) == 150
    assert a["max_seqlen"] == int((cu[1:] - cu[:-1]).max())
    with pytest.raises(ValueError, match="ladder"):
        ref.make_lengths({"T": 1000, "N1": 7}, 1)


def _expert_module():
    return import_file(_task().root / "solutions" / "expert.py", name="varlen_expert_under_test")


def test_schedule_lists_every_tile_once_longest_first():
    """The pre-kernel's list (interpreter): every (sequence, tile) exactly once, sequences by tile
    count descending (ties by index), tiles of a sequence from the last to the first, the slots
    past the total empty; several programs and column steps (N > ROWS, > COLS)."""
    ex = _expert_module()
    gen = torch.Generator().manual_seed(0)
    lens = torch.randint(1, 200, (150,), generator=gen)
    cu = packed.cu_seqlens(lens)
    P = 16
    n = (lens + P - 1) // P
    n_slots = -(-int(cu[-1]) // P) + 150
    tiles = torch.full((2, n_slots), -7, dtype=torch.int32)
    ex._schedule_kernel[(-(-150 // ex.SCHED_ROWS),)](cu, tiles, 150, n_slots, P=P, ROWS=ex.SCHED_ROWS, COLS=ex.SCHED_COLS)
    order = sorted(range(150), key=lambda s: (-int(n[s]), s))
    want = [(s, t) for s in order for t in range(int(n[s]) - 1, -1, -1)]
    total = len(want)
    assert list(zip(tiles[0, :total].tolist(), tiles[1, :total].tolist())) == want
    assert (tiles[0, total:] == -1).all()


@pytest.mark.parametrize("solution, workloads", [
    ("expert", ["smoke_t160_n9_h3x1_d16_edge"]),
    ("straightforward", ["smoke_t126_n6_h2x1_d16_ladder"]),
])
def test_solutions_pass_smoke_workloads(solution, workloads, shipped):
    # the session's shared evaluation with every defence on (tests/shipped.py)
    for r in shipped.results(TASK, solution, workloads):
        assert r.status is Status.OK, (r.workload, r.cause, [v.rule for v in r.violations])
        assert r.checks and all(c.passed for c in r.checks)


def _variant(tmp_path, base: str, old: str, new: str):
    return packed.solution_variant(_task(), base, old, new, tmp_path / f"varlen_{base}_bug.py")


def test_causal_off_by_one_fails_through_the_harness(tmp_path):
    # the one-loop path (the interpreter's and the GPU's): row i also sees key i + 1
    bug = _variant(tmp_path, "expert", "from real rows)\n                qk = tl.where(pos[:, None] >= kn[None, :]",
                   "from real rows)\n                qk = tl.where(pos[:, None] + 1 >= kn[None, :]")
    r = _evaluate(bug, ["smoke_t160_n9_h3x1_d16_edge"]).candidate.results[0]
    assert r.status is Status.INCORRECT and "o:oracle:rel_fro" in r.cause, r.cause


#: (test id, solution, text replaced, replacement): each breaks the map on the smoke inputs and
#: stays within the tensors (run in this process; a schedule bug that sends programs to unwritten
#: slots would read out of bounds: the schedule test checks the list itself).
BUGS = [
    # keys read from the start of the packed batch instead of the sequence's own start
    ("keys_from_batch_start", "expert", "k_tile = K + bos64 * stride_kt", "k_tile = K + 0 * stride_kt"),
    # the LSE left in base 2
    ("lse_in_base_2", "expert", "lse = (m_i + tl.log2(l_i)) * 0.6931471805599453", "lse = m_i + tl.log2(l_i)"),
    # the padded-grid port forgets the sequence offset of the keys
    ("straightforward_keys_without_offset", "straightforward", "krow = (bos + kn).to(tl.int64)", "krow = kn.to(tl.int64)"),
]


@pytest.mark.parametrize("base, old, new", [b[1:] for b in BUGS], ids=[b[0] for b in BUGS])
def test_classic_bugs_break_the_map(tmp_path, base, old, new):
    mod = import_file(_variant(tmp_path, base, old, new), name=f"varlen_bug_{base}_{abs(hash(old))}")
    task = _task()
    args = _args("smoke_t126_n6_h2x1_d16_ladder", seed=5)
    o_ref, lse_ref = task.reference_module().oracle(*args)
    o, lse = mod.run(*args)
    bad_o = not torch.isfinite(o).all() or packed.rel_rows(o, o_ref) > 1e-3
    bad_lse = not torch.isfinite(lse).all() or float((lse.double() - lse_ref).abs().max()) > 1e-3
    assert bad_o or bad_lse


def test_alternatives_match_the_reference_on_cpu():
    """flash_varlen and sdpa_padded through their CPU stand-ins: packing, padding, gathers and the
    LSE layout (contiguous outputs of the declared shapes)."""
    task = _task()
    ref = task.reference_module()
    for w in ("smoke_t150_n5_h4x2_d32_random", "smoke_t160_n9_h3x1_d16_edge"):
        args = _args(w, seed=9)
        o_ref, lse_ref = ref.oracle(*args)
        for name in ("flash_varlen", "sdpa_padded"):
            mod = import_file(task.root / "alternatives" / f"{name}.py", name=f"varlen_alt_{name}")
            o, lse = mod.run(*args)
            assert o.shape == args[0].shape and lse.shape == (args[0].shape[1], args[0].shape[0]), name
            assert o.is_contiguous() and lse.is_contiguous() and lse.dtype == torch.float32, name
            assert packed.rel_rows(o, o_ref) < 1e-3, (w, name)
            assert float((lse.double() - lse_ref).abs().max()) < 1e-4 + 1e-4 * float(lse_ref.abs().max()), (w, name)


def test_flashinfer_alternative_names_the_missing_package(monkeypatch):
    packed.assert_names_missing_flashinfer(monkeypatch, _task().root / "alternatives" / "flashinfer_ragged.py",
                                    "varlen_alt_flashinfer", _args("smoke_t150_n5_h4x2_d32_random"))


def test_tolerance_probes_separate_on_smoke_workloads():
    packed.assert_probes_separate(_task(), ["smoke_t150_n5_h4x2_d32_random", "smoke_t126_n6_h2x1_d16_ladder"])


def test_expert_tile_plan_for_the_h200():
    """The GPU tile (interpreter off): 128 rows / 8 warps at D = 128 for groups of 4, 5 and 8;
    a group larger than the tile is refused."""
    ex = packed.import_for_gpu(_task().root / "solutions" / "expert.py", "varlen_expert_gpu_plan")
    for g in (4, 5, 8):
        cfg = ex.tile_config(128, g)
        assert (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_warps"]) == (128, 64, 8)
    with pytest.raises(ValueError, match="exceeds"):
        ex.tile_config(128, 256)
