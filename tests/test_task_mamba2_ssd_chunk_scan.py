"""mamba2_ssd_chunk_scan: the task validates; the registered workloads follow the Mamba2-2.7B,
Mamba-Codestral-7B and Nemotron-3-Super configs; the inputs have the documented structure
(lengths, NaN only in fresh slots); the SSD block decomposition of calibration.py equals the
sequential scan; the SOL formulas match hand counts; expert and straightforward pass smoke
workloads through the harness (integrity on); classic bugs fail; the tolerance probes separate;
the mamba_ssm alternative's glue (batched and per-sequence paths, pool gather / scatter)
matches the reference with a stand-in for mamba_ssm.

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

TID = "mamba2_ssd_chunk_scan"
NAMES = ["x", "dt", "dt_bias", "A", "B", "C", "D", "cu_seqlens", "state_pool", "state_indices", "has_initial_state",
         "chunk_size"]


@pytest.fixture(scope="module")
def task():
    return load_task(TID)


def _inputs(task, wid: str, seed: int = 3) -> dict:
    return dict(zip(NAMES, make_args(task.reference_module(), task.spec, task.spec.workload(wid), seed, "cpu")))


def test_task_validates():
    assert validate_task(TID, run_alternatives=False) == []


def test_registered_workloads_follow_model_configs(task):
    """Mamba2-2.7B 80 x 64 heads, 1 group, chunk 256; Codestral-7B and Nemotron-3-Super 128 x 64
    heads, 8 groups, chunks 256 and 128; state 128 everywhere."""
    timed = {w.id: w.axes for w in task.spec.workloads if not task.spec.workload(w.id).correctness_only}
    assert len(timed) == 3 and any(w.correctness_only for w in task.spec.workloads)
    assert all(a["P"] == 64 and a["DS"] == 128 for a in timed.values())
    assert {k: timed["mamba2_2p7b_t32768"][k] for k in ("H", "G", "Q")} == {"H": 2560 * 2 // 64, "G": 1, "Q": 256}
    assert {k: timed["codestral_mamba_7b_8x4096"][k] for k in ("H", "G", "Q")} == {"H": 4096 * 2 // 64, "G": 8, "Q": 256}
    assert {k: timed["nemotron3_super_varlen16"][k] for k in ("H", "G", "Q")} == {"H": 128, "G": 8, "Q": 128}


def test_inputs_lengths_slots_and_steps(task):
    ref = task.reference_module()
    for w in task.spec.all_workloads():
        for seed in (1, 2):
            lens = ref.seq_lens(w.values(), seed)
            assert int(lens.sum()) == w.axes["T"] and int(lens.min()) >= 1 and len(lens) == w.axes["N"], w.id
    edge = ref.seq_lens(task.spec.workload("adv_edge_lengths_extreme_dt").values(), 1)
    assert {1, 2, 63, 64, 65, 255, 256, 257}.issubset(set(edge.tolist()))
    a = _inputs(task, "smoke_varlen_n3_h4_g2_q64")
    slots = a["state_indices"].long()
    fresh = slots[~a["has_initial_state"]]
    assert torch.isnan(a["state_pool"][fresh]).all() and a["has_initial_state"].any() and not a["has_initial_state"].all()
    rest = torch.ones(a["state_pool"].shape[0], dtype=torch.bool)
    rest[fresh] = False
    assert torch.isfinite(a["state_pool"][rest]).all() and len(set(slots.tolist())) == len(slots)
    assert (a["A"] < 0).all() and a["chunk_size"] == 64
    dtp = torch.nn.functional.softplus(_inputs(task, "smoke_edge_extreme_dt_n4")["dt"].float() + a["dt_bias"][:2])
    assert float(dtp.min()) < 1e-4 and float(dtp.max()) > 1.0                 # dt' over many decades


def test_ssd_decomposition_equals_the_scan(task):
    """The SSD block decomposition in fp32 (calibration.chunked, chunks of 16 and 64) reproduces
    the sequential scan to fp32 rounding, outputs and final states."""
    cal = import_file(task.root / "calibration.py")
    ref = task.reference_module()
    a = _inputs(task, "smoke_edge_extreme_dt_n4", 5)
    a32 = {k: (v.float() if isinstance(v, torch.Tensor) and v.dtype == torch.float16 else v) for k, v in a.items()}
    pool_r = a32["state_pool"].clone()
    y_r = ref.run(**{**a32, "state_pool": pool_r})
    slots = a["state_indices"].long()
    for chunk in (16, 64):
        pool_c = a32["state_pool"].clone()
        y_c = cal.chunked(*[a32[n] if n != "state_pool" else pool_c for n in NAMES], rounded=False, chunk=chunk)
        assert torch.allclose(y_c, y_r, rtol=1e-3, atol=1e-4), chunk
        assert torch.allclose(pool_c[slots], pool_r[slots], rtol=1e-3, atol=1e-5), chunk


def test_sol_counts_by_hand(task):
    w = task.spec.workload("mamba2_2p7b_t32768")
    T, H, P, G, DS, Q = 32768, 80, 64, 1, 128, 256
    chunks = T / Q + 0.5
    flops = chunks * (H * (2 * Q * P * DS + 2 * Q * P * DS + 2 * (Q * Q / 2) * P) + G * 2 * Q * Q * DS)
    nbytes = T * H * P * 2 * 2 + T * G * DS * 2 * 2 + T * H * 2 + 2 * H * P * DS * 4
    h200 = ceilings("H200", "measured")
    ms, bound = sol_ms(task.spec.sol.counts("ssd_min"), w.axes, h200)
    assert ms == pytest.approx(max(flops / 790e12, nbytes / 4.3e12) * 1e3, rel=1e-6) and bound == "tensor_core"
    assert 0.15 < ms < 0.18


# --------------------------------------------------------------------------- through the harness
def _evaluate(solution, workloads: list[str], integrity: bool = True, calls: int = 1):
    task = load_task(TID)
    return evaluate(task, solution, [task.spec.workload(w) for w in workloads], device="cpu", baseline=None,
                    options=Options(cpu_samples=1, check_calls=calls, time_solutions=False, integrity=integrity))


@pytest.mark.parametrize("solution, workloads", [
    param(TID, "expert", "expert", ["smoke_varlen_n3_h4_g2_q64", "smoke_edge_extreme_dt_n4"], id="expert"),
    param(TID, "straightforward", "straightforward", ["smoke_edge_extreme_dt_n4"], id="straightforward"),
])
def test_solutions_pass_smoke_workloads(solution, workloads, shipped):
    # the session's shared evaluation with every defence on (tests/shipped.py)
    for r in shipped.results(TID, solution, workloads):
        assert r.status is Status.OK, (r.workload, r.cause, [v.rule for v in r.violations])
        assert any(c.name.startswith("state:state_pool") for c in r.checks)


#: (test id, solution, text replaced, replacement, smoke workload, failing check prefix)
BUGS = [
    # the initial state loaded for every sequence: a fresh sequence's slot is NaN
    ("expert_reads_fresh_slots", "expert", "S = tl.load(sp, mask=has & (rp[:, None] >= 0), other=0.0)",
     "S = tl.load(sp)", "smoke_edge_extreme_dt_n4", "y:finite"),
    # the causal mask of the intra-chunk product dropped (later rows of a diagonal tile leak in)
    ("expert_causal_mask_dropped", "expert", "ok = (rows[:, None] >= ks[None, :]) & mk[None, :] & m[:, None]",
     "ok = mk[None, :] & m[:, None]", "smoke_varlen_n3_h4_g2_q64", "y:"),
    # heads mapped to groups by h mod G (interleaved) in the recurrent port
    ("straightforward_groups_interleaved", "straightforward", "    gi = h // HPG\n", "    gi = h % (H // HPG)\n",
     "smoke_varlen_n3_h4_g2_q64", "y:reference:rel_fro"),
]


@pytest.mark.parametrize("base, old, new, wid, check", [b[1:] for b in BUGS], ids=[b[0] for b in BUGS])
def test_classic_bug_fails(tmp_path, base, old, new, wid, check):
    src = (load_task(TID).root / "solutions" / f"{base}.py").read_text()
    assert src.count(old) == 1, old
    bug = tmp_path / f"{base}_bug.py"
    bug.write_text(src.replace(old, new))
    r = _evaluate(bug, [wid], integrity=False).candidate.results[0]
    assert r.status is Status.INCORRECT and check in r.cause, (r.status, r.cause)


def test_tolerance_probes_separate_on_a_smoke_workload(task):
    res = calibrate(task, [task.spec.workload("smoke_varlen_n3_h4_g2_q64")], "cpu", calls=1)
    for probe, (expect, accepted, as_expected) in verdicts(res).items():
        assert as_expected, (probe, expect, accepted, [(r.workload, r.errors) for r in res if r.probe == probe])


@pytest.mark.parametrize("wid", ["smoke_single_n1_h2_q128", "smoke_varlen_n3_h4_g2_q64"])
def test_mamba_alternative_glue_with_a_stand_in(task, monkeypatch, wid):
    """The alternative's batched path (equal lengths) and per-sequence path, its pool gather
    (NaN slots zeroed) and final-state scatter, with a stand-in for mamba_chunk_scan_combined
    (the reference scan per batch row)."""
    ref = task.reference_module()
    calls = []

    # mamba-ssm 2.3.2's signature (keyword defaults as upstream): a keyword it does not take fails here
    # as it did on the H200 (``state_dtype``, which only later forks take)
    def fake(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
             cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
             return_varlen_states=False):
        assert dt_softplus and return_final_states and z is None and seq_idx is None and not return_varlen_states
        assert torch.isfinite(initial_states).all() and initial_states.shape[0] == x.shape[0]
        calls.append(x.shape[0])
        ys, pool = [], initial_states.clone()
        for b in range(x.shape[0]):
            L = x.shape[1]
            ys.append(ref.run(x[b], dt[b], dt_bias, A, B[b], C[b], D, torch.tensor([0, L], dtype=torch.int32),
                              pool[b:b + 1], torch.zeros(1, dtype=torch.int32), torch.ones(1, dtype=torch.bool),
                              chunk_size))
        return torch.stack(ys), pool

    mod = types.ModuleType("mamba_ssm.ops.triton.ssd_combined")
    mod.mamba_chunk_scan_combined = fake
    for name in ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "mamba_ssm.ops.triton.ssd_combined", mod)
    alt = import_file(task.root / "alternatives" / "mamba_chunk_scan_combined.py")
    a = _inputs(task, wid, 9)
    pool_r, pool_a = a["state_pool"].clone(), a["state_pool"].clone()
    y_r = ref.run(**{**a, "state_pool": pool_r})
    y_a = alt.run(**{**a, "state_pool": pool_a})
    assert calls == ([1] if wid.startswith("smoke_single") else [1, 1, 1])
    assert torch.allclose(y_a.float(), y_r.float(), rtol=1e-3, atol=1e-3)   # batch-shape-dependent fp32 sums
    assert torch.allclose(pool_a, pool_r, rtol=1e-5, atol=1e-6, equal_nan=True)
    monkeypatch.setitem(sys.modules, "mamba_ssm.ops.triton.ssd_combined", None)
    with pytest.raises(RuntimeError, match="mamba-ssm"):
        alt.run(**{**a, "state_pool": a["state_pool"].clone()})
