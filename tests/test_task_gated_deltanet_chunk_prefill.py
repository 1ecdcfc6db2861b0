"""gated_deltanet_chunk_prefill: the task validates; the registered workloads follow Qwen3-Next's
linear-attention config; the inputs have the documented structure (lengths, NaN only in fresh
slots, gates); the chunked (WY / UT) algebra of calibration.py equals the token recurrence; the
SOL formulas match hand counts; expert and straightforward pass smoke workloads through the
harness (integrity on); classic bugs fail; the tolerance probes separate; the fla alternative's
glue (pool gather / scatter, argument mapping) matches the reference with a stand-in for fla.

CPU only (Triton under TRITON_INTERPRET=1, float16 smoke workloads); the bf16 numerics and the
speed are the H200's to confirm (``d2k calibrate`` / ``d2k bench``).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first triton import

import sys  # noqa: E402
import types  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from shipped import param  # noqa: E402

from d2kbench.checking.inputs import make_args  # noqa: E402
from d2kbench.harness.calibrate import calibrate, verdicts  # noqa: E402
from d2kbench.harness.evaluate import Options, evaluate  # noqa: E402
from d2kbench.harness.validate import validate_task  # noqa: E402
from d2kbench.results import Status  # noqa: E402
from d2kbench.scoring.sol import ceilings, sol_ms  # noqa: E402
from d2kbench.tasks import load_task  # noqa: E402
from d2kbench.tasks.loader import import_file  # noqa: E402

TID = "gated_deltanet_chunk_prefill"
NAMES = ["q", "k", "v", "g", "beta", "cu_seqlens", "state_pool", "state_indices", "has_initial_state", "scale"]


@pytest.fixture(scope="module")
def task():
    return load_task(TID)


def _inputs(task, wid: str, seed: int = 3) -> dict:
    return dict(zip(NAMES, make_args(task.reference_module(), task.spec, task.spec.workload(wid), seed, "cpu")))


def test_task_validates():
    assert validate_task(TID, run_alternatives=False) == []


def test_registered_workloads_follow_qwen3_next(task):
    """Qwen3-Next-80B-A3B linear attention: 16 key / 32 value heads of 128 (TP1), halved under TP2."""
    timed = {w.id: w for w in task.spec.workloads if not w.correctness_only}
    assert len(timed) == 3 and any(w.correctness_only for w in task.spec.workloads)
    for w in timed.values():
        assert w.axes["K"] == w.axes["V"] == 128 and w.axes["HV"] == 2 * w.axes["HK"], w.id
    assert (timed["qwen3_next_80b_tp1_t16384"].axes["HK"], timed["qwen3_next_80b_tp2_4x8192"].axes["HK"]) == (16, 8)
    assert timed["qwen3_next_80b_tp1_varlen16"].params == {"lens": "skewed", "init": "some"}


def test_inputs_lengths_slots_and_gates(task):
    ref = task.reference_module()
    for w in task.spec.all_workloads():
        for seed in (1, 2):
            lens = ref.seq_lens(w.values(), seed)
            assert int(lens.sum()) == w.axes["T"] and int(lens.min()) >= 1 and len(lens) == w.axes["N"], w.id
    edge = ref.seq_lens(task.spec.workload("adv_edge_lengths_strong_decay_tp4").values(), 1)
    assert {1, 2, 63, 64, 65, 127, 129}.issubset(set(edge.tolist()))
    a = _inputs(task, "smoke_varlen_n3_h2x4_d32")
    slots = a["state_indices"].long()
    fresh = slots[~a["has_initial_state"]]
    assert torch.isnan(a["state_pool"][fresh]).all() and a["has_initial_state"].any() and not a["has_initial_state"].all()
    rest = torch.ones(a["state_pool"].shape[0], dtype=torch.bool)
    rest[fresh] = False
    assert torch.isfinite(a["state_pool"][rest]).all() and len(set(slots.tolist())) == len(slots)
    assert (a["g"] <= 0).all() and ((a["beta"] > 0) & (a["beta"] < 1)).all()
    strong = _inputs(task, "smoke_edge_strong_decay_n4")
    assert float(strong["g"].min()) < -5.0                                  # in-chunk cumsums reach hundreds


def test_chunked_algebra_equals_the_recurrence(task):
    """The WY / UT chunked form in fp32 (calibration.chunked, chunk 16 and 64) reproduces the
    token-by-token reference to fp32 rounding, outputs and final states."""
    cal = import_file(task.root / "calibration.py")
    ref = task.reference_module()
    a = _inputs(task, "smoke_edge_strong_decay_n4", 5)
    a32 = {k: (v.float() if isinstance(v, torch.Tensor) and v.dtype == torch.float16 else v) for k, v in a.items()}
    pool_r = a32["state_pool"].clone()
    o_r = ref.run(**{**a32, "state_pool": pool_r})
    slots = a["state_indices"].long()
    for chunk in (16, 64):
        pool_c = a32["state_pool"].clone()
        o_c = cal.chunked(*[a32[n] if n != "state_pool" else pool_c for n in NAMES], rounded=False, chunk=chunk)
        assert torch.allclose(o_c, o_r, rtol=1e-3, atol=1e-4), chunk
        assert torch.allclose(pool_c[slots], pool_r[slots], rtol=1e-3, atol=1e-5), chunk


def test_sol_counts_by_hand(task):
    w = task.spec.workload("qwen3_next_80b_tp1_t16384")
    T, HK, HV, K, V = 16384, 16, 32, 128, 128
    chunks = T / 64 + 0.5
    flops = chunks * HV * (6 * 64 * K * V + 2 * 64 * 64 * (3 * K + 2 * V))
    nbytes = T * HK * K * 2 * 2 + T * HV * V * 2 * 2 + T * HV * (4 + 2) + 2 * HV * K * V * 4
    h200 = ceilings("H200", "measured")
    ms, bound = sol_ms(task.spec.sol.counts("chunked_min"), w.axes, h200)
    assert ms == pytest.approx(max(flops / 790e12, nbytes / 4.3e12) * 1e3, rel=1e-6) and bound == "tensor_core"
    assert 0.11 < ms < 0.13


# --------------------------------------------------------------------------- through the harness
def _evaluate(solution, workloads: list[str], integrity: bool = True, calls: int = 1):
    task = load_task(TID)
    return evaluate(task, solution, [task.spec.workload(w) for w in workloads], device="cpu", baseline=None,
                    options=Options(cpu_samples=1, check_calls=calls, time_solutions=False, integrity=integrity))


@pytest.mark.parametrize("solution, workloads", [
    param(TID, "expert", "expert", ["smoke_varlen_n3_h2x4_d32", "smoke_edge_strong_decay_n4"], id="expert"),
    param(TID, "straightforward", "straightforward", ["smoke_edge_strong_decay_n4"], id="straightforward"),
])
def test_solutions_pass_smoke_workloads(solution, workloads, shipped):
    # the session's shared evaluation with every defence on (tests/shipped.py)
    for r in shipped.results(TID, solution, workloads):
        assert r.status is Status.OK, (r.workload, r.cause, [v.rule for v in r.violations])
        assert any(c.name.startswith("state:state_pool") for c in r.checks)


#: (test id, solution, text replaced, replacement, failing check prefix)
BUGS = [
    # the initial state loaded for every sequence: a fresh sequence's slot is NaN
    ("expert_reads_fresh_slots", "expert", "S = tl.load(sp, mask=has & (rk[:, None] >= 0), other=0.0)",
     "S = tl.load(sp)", "o:finite"),
    # the diagonal of the chunk system's blocks kept (A = I + N with beta k.k on the diagonal too)
    ("expert_inverse_not_strict", "expert", "    strict = r[:, None] > r[None, :]\n",
     "    strict = r[:, None] >= r[None, :]\n", "o:reference:rel_fro"),
    # the final state written to slot 0 instead of the sequence's slot
    # every sequence's state read from and written to slot 0: the slots of the others keep their
    # old state (certain on every draw); the outputs differ only where the old state still
    # matters (not under strong decay), so the state check is the one to expect
    ("straightforward_wrong_slot", "straightforward", "    slot = tl.load(idx_ptr + seq).to(tl.int64)\n",
     "    slot = tl.load(idx_ptr + seq).to(tl.int64) * 0\n", "state:state_pool"),
]


@pytest.mark.parametrize("base, old, new, check", [b[1:] for b in BUGS], ids=[b[0] for b in BUGS])
def test_classic_bug_fails(tmp_path, base, old, new, check):
    src = (load_task(TID).root / "solutions" / f"{base}.py").read_text()
    assert src.count(old) == 1, old
    bug = tmp_path / f"{base}_bug.py"
    bug.write_text(src.replace(old, new))
    r = _evaluate(bug, ["smoke_edge_strong_decay_n4"], integrity=False).candidate.results[0]
    failed = [c.name for c in r.checks if not c.passed]  # the cause names only the first failing check
    assert r.status is Status.INCORRECT and any(n.startswith(check) for n in failed), (r.status, r.cause, failed)


def test_tolerance_probes_separate_on_a_smoke_workload(task):
    res = calibrate(task, [task.spec.workload("smoke_varlen_n3_h2x4_d32")], "cpu", calls=1)
    for probe, (expect, accepted, as_expected) in verdicts(res).items():
        assert as_expected, (probe, expect, accepted, [(r.workload, r.errors) for r in res if r.probe == probe])


def test_fla_alternative_glue_with_a_stand_in(task, monkeypatch):
    """The alternative's pool gather (NaN slots zeroed), argument mapping and final-state scatter,
    with a stand-in for fla's chunk_gated_delta_rule (the reference recurrence on the batch)."""
    ref = task.reference_module()
    seen = {}

    def fake(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens):
        assert q.shape[0] == 1 and cu_seqlens.dtype == torch.int64 and use_qk_l2norm_in_kernel and output_final_state
        assert torch.isfinite(initial_state).all()
        seen["called"] = True
        pool = initial_state.clone()
        n = pool.shape[0]
        o = ref.run(q[0], k[0], v[0], g[0], beta[0], cu_seqlens.int(), pool, torch.arange(n, dtype=torch.int32),
                    torch.ones(n, dtype=torch.bool), scale)
        return o[None], pool

    mod = types.ModuleType("fla.ops.gated_delta_rule")
    mod.chunk_gated_delta_rule = fake
    for name in ("fla", "fla.ops"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule", mod)
    alt = import_file(task.root / "alternatives" / "fla_chunk_gated_delta_rule.py")
    a = _inputs(task, "smoke_varlen_n3_h2x4_d32", 9)
    pool_r, pool_a = a["state_pool"].clone(), a["state_pool"].clone()
    o_r = ref.run(**{**a, "state_pool": pool_r})
    o_a = alt.run(**{**a, "state_pool": pool_a})
    assert seen and torch.allclose(o_a.float(), o_r.float(), rtol=1e-3, atol=1e-3)
    assert torch.allclose(pool_a, pool_r, rtol=1e-5, atol=1e-6, equal_nan=True)   # same slots written, canaries kept
    monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule", None)
    with pytest.raises(RuntimeError, match="fla-core"):
        alt.run(**{**a, "state_pool": a["state_pool"].clone()})
