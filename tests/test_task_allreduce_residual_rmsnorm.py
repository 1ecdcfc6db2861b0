"""allreduce_residual_rmsnorm: the tensor-parallel epilogue (sum of R partial outputs, residual
add, RMSNorm, optional FP8 group quantisation), simulated on one device.

CPU only (Triton under TRITON_INTERPRET=1): the task validates; the registered workloads follow
the model configs (three single-GPU, one distributed of 8 ranks); the SOL bytes match a hand
count; the partials are separate allocations and every one of them moves the output; the
reference matches a real ``torch.distributed`` all-reduce on gloo across ranks (bit for bit on
two ranks, within the task's checks on four, identical on every rank); the tolerances accept
valid reorderings and reject the classic wrong variants at registered-like sizes in bf16;
expert and straightforward pass the harness; mutants (a dropped rank, 16-bit accumulation, a
skipped residual store) fail.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first triton import

import socket  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from d2kbench.checking import checks  # noqa: E402
from d2kbench.checking.ranks import identical_across_ranks  # noqa: E402
from d2kbench.harness.evaluate import Options, evaluate  # noqa: E402
from d2kbench.harness.validate import validate_task  # noqa: E402
from d2kbench.results import Status  # noqa: E402
from d2kbench.tasks import load_task  # noqa: E402
from d2kbench.tasks.formula import evaluate_formula  # noqa: E402
from d2kbench.tasks.loader import import_file  # noqa: E402

TID = "allreduce_residual_rmsnorm"
TASK = load_task(TID)
REF = TASK.reference_module()
#: smoke workloads through the harness (tests/shipped.py ASSERTED): the expert's FP8 path (float16 carrier
#: and bf16 -> e4m3 with the harness's sm_90 conversions) and an
#: outlier workload of 8 ranks; the straightforward port's FP8 path with outliers
EXPERT_SMOKE = ["smoke_r2_t5_h256", "smoke_r4_t7_h384_quant", "smoke_r8_t9_h128_outliers", "smoke_r2_t3_h384_bf16_fp8"]
STRAIGHT_SMOKE = ["smoke_r2_t5_h256", "smoke_r3_t6_h640_outliers_quant"]


def _ok(output: str, out: torch.Tensor, exp: torch.Tensor) -> bool:
    """Every check of task.yaml on ``output`` (``residual``: the state checks) passes."""
    tols = TASK.spec.state_checks["residual"] if output == "residual" else \
        next(o for o in TASK.spec.outputs if o.name == output).checks
    return all(checks.compare(0, output, t, out, exp, ["T", "H"].index).passed for t in tols)


def _module(name: str):
    return import_file(TASK.root / "solutions" / f"{name}.py", f"allreduce_{name}_under_test")


def test_task_validates():
    assert validate_task(TID, run_alternatives=False) == []


def test_registered_workloads_follow_model_configs():
    """Three single-GPU workloads and one distributed (8 ranks) from the public configs."""
    ws = {w.id: w for w in TASK.spec.workloads}
    timed = [w for w in ws.values() if not w.correctness_only]
    assert len([w for w in timed if w.ranks == 1]) == 3 and [w.ranks for w in timed if w.ranks > 1] == [8]
    assert ws["llama31_70b_tp8_t4096"].axes == {"R": 8, "T": 4096, "H": 8192, "GS": 128, "Q": 0}   # hidden 8192, TP8
    assert ws["dsv3_tp8_t2048_fp8g128"].axes == {"R": 8, "T": 2048, "H": 7168, "GS": 128, "Q": 1}  # hidden 7168, FP8 1x128
    assert ws["dsv3_tp8_t2048_fp8g128"].params["ydtype"] == "float8_e4m3fn"
    assert ws["qwen3_235b_a22b_tp4_t8192"].axes == {"R": 4, "T": 8192, "H": 4096, "GS": 128, "Q": 0}  # hidden 4096
    decode = ws["llama31_70b_tp8_t128_decode"]
    assert decode.axes["R"] == decode.ranks == 8 and decode.axes["T"] == 128
    assert {w.params.get("variant") for w in ws.values() if w.correctness_only} == {"rank_outliers"}


def test_sol_bytes_match_hand_count():
    """R partials read + residual read and written + output (bf16, or FP8 codes and scales) + gain."""
    f = TASK.spec.sol.reference.bytes
    a = TASK.spec.workload("llama31_70b_tp8_t4096").axes
    T, H = 4096, 8192
    assert evaluate_formula(f, a) == 8 * T * H * 2 + T * H * 2 * 2 + T * H * 2 + H * 2
    a = TASK.spec.workload("dsv3_tp8_t2048_fp8g128").axes
    T, H = 2048, 7168
    assert evaluate_formula(f, a) == 8 * T * H * 2 + T * H * 2 * 2 + T * H + T * (H // 128) * 4 + H * 2


def test_partials_are_separate_allocations_and_each_moves_the_output():
    """make_inputs gives R storages that do not overlap; one element changed in any one partial
    changes the reference output and the expert's (the property the sensitivity call samples)."""
    wl = TASK.spec.workload("smoke_r4_t7_h384_quant")
    i = REF.make_inputs(wl.values(), 3, "cpu")
    ptrs = {p.untyped_storage().data_ptr() for p in i["partials"]}
    assert len(ptrs) == 4 and all(p.is_contiguous() for p in i["partials"])
    expert = _module("expert")
    base_ref = REF.run(i["partials"], i["residual"].clone(), i["weight"], 1e-6, 128, 1)[0]
    for r in range(4):
        moved = [p.clone() for p in i["partials"]]
        moved[r][2, 5] += 8 * float(moved[r].abs().max())
        for run in (REF.run, expert.run):
            y = run(moved, i["residual"].clone(), i["weight"], 1e-6, 128, 1)[0]
            assert not torch.equal(y[2], base_ref[2]), (r, run.__module__)


def test_rank_outlier_inputs():
    """Row t's dominant partial belongs to rank t mod R; every fourth row nearly cancels."""
    i = REF.make_inputs({"R": 4, "T": 12, "H": 256, "GS": 128, "Q": 0, "variant": "rank_outliers"}, 1, "cpu")
    amax = torch.stack([p.float().abs().amax(-1) for p in i["partials"]])   # [R, T]
    for t in range(12):
        if t % 4 != 3:
            assert int(amax[:, t].argmax()) == t % 4
    s = REF.reduce_partials(i["partials"])
    assert float(s[3].abs().max()) < 0.1 * float(amax[:, 3].max())


# ---- the CPU ground truth: torch.distributed on gloo -------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_reference_matches_gloo_allreduce(tmp_path):
    """Four gloo processes all-reduce their partials and apply the epilogue: every rank's
    outputs are bitwise identical to the others', and pass the task's checks against the
    reference (bit-exact residual); on two ranks the FP32 all-reduce is the reference bit for bit."""
    import torch.multiprocessing as mp
    from gloo_ranks import rank_main

    world = 4
    i = REF.make_inputs({"R": world, "T": 16, "H": 512, "GS": 128, "Q": 1, "variant": "rank_outliers"}, 11, "cpu")
    torch.save(i, tmp_path / "inputs.pt")
    # fork: the ranks inherit the imported torch (a spawned rank would import it again, seconds each)
    mp.start_processes(rank_main, args=(world, _free_port(), str(tmp_path / "inputs.pt"), str(tmp_path)), nprocs=world,
                       start_method="fork")
    outs = [torch.load(tmp_path / f"{r}.pt") for r in range(world)]
    names = ["y", "y_s", "residual"]
    assert all(c.passed for c in identical_across_ranks(0, names, [list(o["all"]) for o in outs]))
    res = i["residual"].clone()
    y, ys = REF.run(i["partials"], res, i["weight"], i["eps"], 128, 1)
    assert y.dtype == torch.float8_e4m3fn
    g_y, g_ys, g_res = outs[0]["all"]
    assert _ok("y", g_y, y) and _ok("y_s", g_ys, ys) and _ok("residual", g_res, res)
    res2 = i["residual"].clone()
    pair = REF.run(i["partials"][:2], res2, i["weight"], i["eps"], 128, 1)
    for got, want in zip(outs[0]["pair"], (*pair, res2)):
        assert torch.equal(checks.bit_pattern(got), checks.bit_pattern(want))


# ---- tolerances at registered-like sizes (bf16, CPU PyTorch emulations) -------------------------
def _variant(i: dict, quant: int, order=None, acc16=False, round_s=True, round_z=True, rstd64=False):
    """An emulation of a kernel: the reference's map with one step changed."""
    parts = [i["partials"][r] for r in (order if order is not None else range(len(i["partials"])))]
    if acc16:
        s = parts[0]
        for p in parts[1:]:
            s = (s.float() + p.float()).to(p.dtype)
        s = s.float()
    else:
        s = REF.reduce_partials(parts)
    dt = i["residual"].dtype
    z = (s.to(dt).float() if round_s else s) + i["residual"].float()
    zr = z.to(dt)
    zf = zr.float() if round_z else z
    ms = zf.double().pow(2).mean(-1, keepdim=True) if rstd64 else zf.pow(2).mean(-1, keepdim=True)
    rstd = torch.rsqrt(ms + 1e-6).float()
    y = (zf * rstd) * i["weight"].float()
    if not quant:
        return y.to(dt), None, zr
    T, H = y.shape
    yg = y.view(T, H // 128, 128)
    sc = yg.abs().amax(-1).clamp_min(1e-10) / 448
    q = (yg * (1.0 / sc)[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn).view(T, H)
    return q, sc, zr


@pytest.mark.parametrize("quant,H", [(0, 8192), (1, 7168)])
def test_tolerances_separate_valid_from_wrong(quant, H):
    i = REF.make_inputs({"R": 8, "T": 32, "H": H, "GS": 128, "Q": quant, "variant": "rank_outliers"}, 2, "cpu")
    res = i["residual"].clone()
    y, ys, _ = *REF.run(i["partials"], res, i["weight"], 1e-6, 128, quant), None

    def passes(v) -> tuple[bool, bool]:
        vy, vs, vz = v
        ok_y = _ok("y", vy, y) and (vs is None or _ok("y_s", vs, ys))
        return ok_y, _ok("residual", vz, res)

    # valid: rstd reduced in another order (float64 here), the reciprocal multiply of the codes
    assert passes(_variant(i, quant, rstd64=True)) == (True, True)
    # wrong: a dropped rank, every add rounded to 16 bits, the sum not rounded before the
    # residual add, the unrounded residual normalised
    assert passes(_variant(i, quant, order=range(7))) == (False, False)
    assert passes(_variant(i, quant, acc16=True)) == (False, False)
    assert passes(_variant(i, quant, round_s=False))[1] is False
    assert passes(_variant(i, quant, round_z=False))[0] is False


# ---- the solutions through the harness ------------------------------------------------------------
@pytest.mark.parametrize("solution,workloads", [("expert", EXPERT_SMOKE), ("straightforward", STRAIGHT_SMOKE)])
def test_solutions_pass_smoke_workloads(solution, workloads, shipped):
    # the session's shared evaluation with every defence on (tests/shipped.py), sensitivity included
    for r in shipped.results(TID, solution, workloads):
        assert r.status.value == "ok", (r.workload, r.cause, [v.rule for v in r.violations])
        assert r.checks and all(c.passed for c in r.checks)


def _mutant(tmp_path, old: str, new: str, base: str):
    src = (TASK.root / "solutions" / f"{base}.py").read_text()
    assert src.count(old) == 1, old
    path = tmp_path / f"{base}_bug.py"
    path.write_text(src.replace(old, new))
    return path


def test_dropped_rank_fails_and_distributed_workload_is_not_run(tmp_path):
    """A kernel that never reads the last rank fails through the harness; the workload of 8
    ranks is reported not_run, with the GPUs it needs, on a machine without them."""
    bug = _mutant(tmp_path, "R=R, QUANT", "R=R - 1 if R > 1 else R, QUANT", "expert")
    wls = [TASK.spec.workload(w) for w in ("smoke_r2_t5_h256", "llama31_70b_tp8_t128_decode")]
    res = evaluate(TASK, bug, wls, device="cpu", baseline=None,
                   options=Options(cpu_samples=1, integrity=False)).candidate.results
    failed = {c.name for c in res[0].checks if not c.passed}
    assert res[0].status is Status.INCORRECT and {"y:reference:ulp", "state:residual:reference:exact"} <= failed, failed
    assert res[1].status is Status.NOT_RUN and "needs 8 GPUs" in res[1].cause, res[1].cause


@pytest.mark.parametrize("base,old,new,fails", [
    # the accumulator in the 16-bit dtype: every rank's add rounded
    ("straightforward", "acc = torch.empty((T, H), dtype=torch.float32", "acc = torch.empty((T, H), dtype=residual.dtype",
     "residual"),
    # the new residual never stored
    ("expert", "        tl.store(r_ptr + offs, z, mask=m3)\n", "", "residual"),
    # the unrounded sum added to the residual
    ("expert", "z = (acc.to(dt).to(tl.float32) + res", "z = (acc + res", "residual"),
])
def test_classic_bugs_fail_the_checks(tmp_path, base, old, new, fails):
    """Each mutant, called directly on the 8-rank outlier smoke workload, fails a check of task.yaml."""
    bug = import_file(_mutant(tmp_path, old, new, base), f"allreduce_bug_{base}")
    wl = TASK.spec.workload("smoke_r8_t9_h128_outliers")
    i = REF.make_inputs(wl.values(), 5, "cpu")
    res, res_bug = i["residual"].clone(), i["residual"].clone()
    y = REF.run(i["partials"], res, i["weight"], 1e-6, 128, 0)[0]
    y_bug = bug.run([p.clone() for p in i["partials"]], res_bug, i["weight"], 1e-6, 128, 0)[0]
    assert not (_ok("y", y_bug, y) and _ok("residual", res_bug, res))
    assert not _ok(fails, res_bug if fails == "residual" else y_bug, res if fails == "residual" else y)
