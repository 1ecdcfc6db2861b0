"""The quantised-GEMM and fused-quantisation tasks: w8a8_block_fp8_matmul, w4a16_gemm,
fused_add_rmsnorm_fp8_quant.

CPU only (Triton under TRITON_INTERPRET=1): the task folders validate; the registered workloads
follow the model configs; the SOL of an FP8 GEMM uses the FP8 tensor-core rate; the inputs
have the documented structure (AWQ field order, block scales, zero rows); the tolerances accept
the valid variants and reject the classic wrong ones (measured with PyTorch emulations at
registered-like K); expert and straightforward pass the harness on smoke workloads (integrity
on); solutions with a classic bug fail. FP8 data paths are exercised with float16 carriers on
the CPU; FP8 numerics and speed are measured on the H200 by ``d2k bench``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first triton import

import pytest  # noqa: E402
import torch  # noqa: E402

from d2kbench.checking import checks  # noqa: E402
from d2kbench.harness.evaluate import Options, evaluate  # noqa: E402
from d2kbench.harness.validate import validate_task  # noqa: E402
from d2kbench.scoring.sol import ceilings, sol_ms  # noqa: E402
from d2kbench.tasks import load_task  # noqa: E402
from d2kbench.tasks.schema import WorkCounts  # noqa: E402

TASKS = ("w8a8_block_fp8_matmul", "w4a16_gemm", "fused_add_rmsnorm_fp8_quant")
#: Smoke workloads through the harness: the expert runs both (its two regimes or layouts), the
#: straightforward port the first (the interpreter is slow).
SMOKE = {
    "w8a8_block_fp8_matmul": ["smoke_m37_n200_k384_spread", "smoke_m130_n320_k256"],
    "w4a16_gemm": ["smoke_m5_n136_k256_extreme", "smoke_m130_n264_k384"],
    "fused_add_rmsnorm_fp8_quant": ["smoke_t7_h384_col", "smoke_t6_h512_magnitudes"],
}


def _ref(tid):
    return load_task(tid).reference_module()


def _checks_pass(task, output: str, out: torch.Tensor, exp: torch.Tensor, axes: list[str]) -> bool:
    spec = next(o for o in task.spec.outputs if o.name == output)
    return all(checks.compare(0, output, t, out, exp, axes.index).passed for t in spec.checks)


@pytest.mark.parametrize("tid", TASKS)
def test_task_validates(tid):
    assert validate_task(tid, run_alternatives=False) == []


def test_registered_workloads_follow_model_configs():
    """Exactly three timed workloads per task, with the public configs' dimensions."""
    for tid in TASKS:
        assert len([w for w in load_task(tid).spec.workloads if not w.correctness_only]) == 3, tid
        assert any(w.correctness_only for w in load_task(tid).spec.workloads), tid
    g = {w.id: w.axes for w in load_task("w8a8_block_fp8_matmul").spec.workloads}
    assert g["dsv3_mlp_down_m64"] == {"M": 64, "N": 7168, "K": 18432}          # intermediate 18432 -> hidden 7168
    assert g["dsv3_o_proj_m4096"] == {"M": 4096, "N": 7168, "K": 128 * 128}    # 128 heads x v_head_dim 128
    assert g["dsv3_fused_qkv_a_m8192"] == {"M": 8192, "N": 1536 + 512 + 64, "K": 7168}
    a = {w.id: w.axes for w in load_task("w4a16_gemm").spec.workloads}
    assert a["llama3_70b_gate_up_m1"] == {"M": 1, "N": 2 * 28672, "K": 8192, "G": 128}
    assert a["llama3_70b_down_m16"] == {"M": 16, "N": 8192, "K": 28672, "G": 128}
    assert a["llama3_8b_gate_up_m4096"] == {"M": 4096, "N": 2 * 14336, "K": 4096, "G": 128}
    n = {w.id: w.axes for w in load_task("fused_add_rmsnorm_fp8_quant").spec.workloads}
    assert n["dsv3_t16384_col"]["H"] == 7168 and n["qwen3_235b_a22b_t32768"]["H"] == 4096
    assert n["qwen3_30b_a3b_t16384"]["H"] == 2048 and all(w["GS"] == 128 for w in n.values())


def test_fp8_tensor_core_flops_use_the_fp8_rate():
    """tc_precision: fp8 bounds the tensor-core FLOPs by the FP8 peak (twice the 16-bit one)."""
    axes = {"M": 4096, "N": 7168, "K": 16384}
    h200 = ceilings("H200", "measured")
    bf16 = sol_ms(WorkCounts(tc_flops="2 * M * N * K"), axes, h200)
    fp8 = sol_ms(WorkCounts(tc_flops="2 * M * N * K", tc_precision="fp8"), axes, h200)
    assert bf16[1] == fp8[1] == "tensor_core"
    assert fp8[0] == pytest.approx(2 * 4096 * 7168 * 16384 / 1267e12 * 1e3)
    assert bf16[0] / fp8[0] == pytest.approx(1267 / 790)
    spec = load_task("w8a8_block_fp8_matmul").spec
    assert spec.sol.reference.tc_precision == "fp8" and load_task("w4a16_gemm").spec.sol.reference.tc_precision == "bf16"
    ms, bind = sol_ms(spec.sol.reference, spec.workload("dsv3_mlp_down_m64").axes, h200)
    assert bind == "memory" and 25e-3 < ms < 40e-3                               # 132 MB of FP8 weights


# ---- inputs -------------------------------------------------------------------------------------
def test_w8a8_inputs_are_block_quantised():
    """Codes are e4m3 values, every group / block reaches 448 exactly once scaled (amax / 448
    scales), the ragged last weight block has its own scale row, and the spread variant spreads."""
    ref = _ref("w8a8_block_fp8_matmul")
    i = ref.make_inputs({"M": 37, "N": 200, "K": 384, "variant": "scale_spread"}, 4, "cpu")
    assert i["As"].shape == (37, 3) and i["Bs"].shape == (2, 3)
    a = i["A"].float().view(37, 3, 128)
    assert torch.equal(a.abs().amax(-1), torch.full((37, 3), 448.0))
    b = torch.cat([i["B"].float(), torch.zeros(56, 384)]).view(2, 128, 3, 128)
    assert torch.equal(b.abs().amax(dim=(1, 3)), torch.full((2, 3), 448.0))  # the 72-row block too
    assert (i["As"].amax(1) / i["As"].amin(1)).max() > 2 ** 8
    h = ref.make_inputs({"M": 4, "N": 128, "K": 256, "qdtype": "float16"}, 4, "cpu")
    assert h["A"].dtype == torch.float16 and torch.equal(h["A"].to(torch.float8_e4m3fn).half(), h["A"])
    assert ref.run(**h).dtype == torch.float16


def test_w4a16_packing_follows_awq_order():
    """Fields at bits 4j and 16 + 4j of a word hold the adjacent columns 2j and 2j + 1, and the
    extreme variant sets the top field (bit 31) of most words."""
    ref = _ref("w4a16_gemm")
    codes = torch.randint(0, 16, (6, 32), dtype=torch.int32)
    words = ref.pack_awq(codes)
    assert torch.equal(ref.unpack_awq(words), codes)
    for j in range(4):
        assert torch.equal((words >> (4 * j)) & 0xF, codes[:, 2 * j::8])
        assert torch.equal((words >> (16 + 4 * j)) & 0xF, codes[:, 2 * j + 1::8])
    i = ref.make_inputs({"M": 5, "N": 2056, "K": 1024, "G": 128, "variant": "extreme"}, 1, "cpu")
    assert (i["qweight"] < 0).float().mean() > 0.3 and i["qzeros"].shape == (8, 257)
    assert i["scales"].shape == (8, 2056) and i["x"].dtype == torch.float16


def test_rmsnorm_adversarial_inputs():
    ref = _ref("fused_add_rmsnorm_fp8_quant")
    i = ref.make_inputs({"T": 300, "H": 512, "GS": 128, "variant": "magnitudes"}, 2, "cpu")
    z = i["x"].float() + i["residual"].float()
    zero_rows = (z == 0).all(1)
    assert zero_rows[0] and zero_rows.sum() >= 1
    mags = i["residual"].float().abs().amax(1)
    assert mags.max() / mags[mags > 0].min() > 1e4
    g = ref.make_inputs({"T": 64, "H": 1024, "GS": 128, "variant": "zero_groups"}, 2, "cpu")
    zg = (g["x"].float() + g["residual"].float()).view(64, 8, 128)
    assert (zg == 0).all(-1).any() and not (zg == 0).all(-1).all(-1).any()
    q, s = ref.run(**g)
    assert torch.isfinite(s).all() and (s == 1e-10 / 448).any()


# ---- tolerances against emulated variants ---------------------------------------------------------
def _block_gemm_variant(i, acc_dtype=torch.float32, mantissa_bits=None):
    """C with per-128-K promotion: each block's partial product optionally cut to
    ``mantissa_bits`` (a model of reduced-precision FP8 MMA accumulation), the master
    accumulator kept in ``acc_dtype``."""
    A, B, As, Bs = i["A"].float(), i["B"].float(), i["As"], i["Bs"]
    bs = Bs.repeat_interleave(128, 0)[: B.shape[0]]
    acc = torch.zeros(A.shape[0], B.shape[0])
    for kb in range(A.shape[1] // 128):
        p = A[:, kb * 128:(kb + 1) * 128] @ B[:, kb * 128:(kb + 1) * 128].T
        if mantissa_bits:
            m, e = torch.frexp(p)
            p = torch.ldexp(torch.round(m * 2.0 ** mantissa_bits) / 2.0 ** mantissa_bits, e)
        acc = (acc + p * (As[:, kb:kb + 1] * bs[:, kb][None, :])).to(acc_dtype).float()
    return acc.to(torch.bfloat16)


def test_w8a8_tolerance_accepts_promotion_and_rejects_low_precision_accumulators():
    task = load_task("w8a8_block_fp8_matmul")
    ref = task.reference_module()
    i = ref.make_inputs({"M": 16, "N": 256, "K": 7168}, 3, "cpu")
    exp = ref.run(**i)
    ok = lambda c: _checks_pass(task, "C", c, exp, ["M", "N"])  # noqa: E731
    assert ok(_block_gemm_variant(i)) and ok(_block_gemm_variant(i, mantissa_bits=13))
    assert not ok(_block_gemm_variant(i, acc_dtype=torch.bfloat16))
    a, b = ref.dequantize(i["A"], i["As"], i["B"], i["Bs"])
    assert not ok((a.bfloat16().float() @ b.bfloat16().float().T).bfloat16())   # dequantise to bf16 first


def test_w4a16_tolerance_rejects_fp16_accumulation():
    task = load_task("w4a16_gemm")
    ref = task.reference_module()
    i = ref.make_inputs({"M": 8, "N": 256, "K": 8192, "G": 128}, 2, "cpu")
    exp = ref.run(**i)
    x, W = i["x"].float(), ref.dequantize(i["qweight"], i["qzeros"], i["scales"], 128).float()
    q, z = ref.unpack_awq(i["qweight"]), ref.unpack_awq(i["qzeros"]).repeat_interleave(128, 0)
    w32 = (q - z).float() * i["scales"].float().repeat_interleave(128, 0)
    acc16 = torch.zeros(8, 256, dtype=torch.float16)
    for k in range(0, 8192, 16):                                 # fp16 accumulator, one rounding per MMA step
        acc16 = (acc16.float() + x[:, k:k + 16] @ W[k:k + 16]).half()
    ok = lambda c: _checks_pass(task, "y", c, exp, ["M", "N"])  # noqa: E731
    assert ok((x @ w32).half()) and ok((x.double() @ W.double()).half())
    assert not ok(acc16) and not ok((x @ w32.bfloat16().float()).half())


def test_rmsnorm_tolerance_accepts_reordering_and_rejects_unrounded_residual():
    task = load_task("fused_add_rmsnorm_fp8_quant")
    ref = task.reference_module()
    i = ref.make_inputs({"T": 64, "H": 7168, "GS": 128}, 5, "cpu")
    x, w, res = i["x"].float(), i["weight"].float(), i["residual"].clone()
    q_ref, s_ref = ref.run(i["x"], res, i["weight"], 1e-6, 128, False)

    def variant(round_z=True):
        z = x + i["residual"].float()
        z = z.bfloat16().float() if round_z else z
        rstd = torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 1e-6)
        zw = (z * w).view(64, 56, 128)
        s = (zw.abs().amax(-1) * rstd).clamp_min(1e-10) / 448          # amax |z w| * rstd
        q = (zw * (rstd / s)[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn).view(64, 7168)
        return q, s

    q, s = variant()
    assert _checks_pass(task, "x_q", q, q_ref, ["T", "H"]) and _checks_pass(task, "x_s", s, s_ref, ["T", "H"])
    q, s = variant(round_z=False)
    assert not _checks_pass(task, "x_q", q, q_ref, ["T", "H"]) and not _checks_pass(task, "x_s", s, s_ref, ["T", "H"])


# ---- the solutions through the harness ------------------------------------------------------------
def _evaluate(tid: str, solution, workloads: list[str], integrity: bool = True):
    task = load_task(tid)
    return evaluate(task, solution, [task.spec.workload(w) for w in workloads], device="cpu", baseline=None,
                    options=Options(cpu_samples=1, integrity=integrity))


@pytest.mark.parametrize("solution", ["expert", "straightforward"])
@pytest.mark.parametrize("tid", TASKS)
def test_solutions_pass_smoke_workloads(tid, solution, shipped):
    # the session's shared evaluation with every defence on (tests/shipped.py)
    for r in shipped.results(tid, solution, SMOKE[tid] if solution == "expert" else SMOKE[tid][:1]):
        assert r.status.value == "ok", (r.workload, r.cause, [v.rule for v in r.violations])
        assert r.checks and all(c.passed for c in r.checks)


def _variant(tid: str, tmp_path, old: str, new: str, base: str = "straightforward"):
    src = (load_task(tid).root / "solutions" / f"{base}.py").read_text()
    assert src.count(old) == 1, old
    path = tmp_path / f"{tid}_{base}_bug.py"
    path.write_text(src.replace(old, new))
    return path


@pytest.mark.parametrize("old,new", [
    # every column uses the first weight block's scales (the ragged last block's scale row ignored)
    ("bs_ptrs = bs_ptr + (offs_bn // BK) * stride_bs", "bs_ptrs = bs_ptr + (offs_bn // BK) * 0"),
    # the activation scale of the first K block for every block (scales factored out of the K loop)
    ("a_s = tl.load(as_ptrs + kb)", "a_s = tl.load(as_ptrs)"),
])
def test_w8a8_scale_bugs_fail(tmp_path, old, new):
    bug = _variant("w8a8_block_fp8_matmul", tmp_path, old, new)
    r = _evaluate("w8a8_block_fp8_matmul", bug, ["smoke_m37_n200_k384_spread"], integrity=False).candidate.results[0]
    assert r.status.value == "incorrect" and "C:reference:rel_fro" in r.cause, r.cause


@pytest.mark.parametrize("old,new", [
    # natural nibble order for one column pair: column 2 read from bits 16..19 (column 1's field)
    ("w1 = _field_w16(words, zw, s_row, p_ok, 4, 2)", "w1 = _field_w16(words, zw, s_row, p_ok, 16, 2)"),
    # zero point ignored (only the 1024 offset removed)
    ("return (_f16_1024_plus(words, SH) - _f16_1024_plus(zw, SH)[None, :]) * s[None, :]",
     "return (_f16_1024_plus(words, SH) - 1024.0) * s[None, :]"),
])
def test_w4a16_unpacking_bugs_fail(tmp_path, old, new):
    bug = _variant("w4a16_gemm", tmp_path, old, new, base="expert")
    r = _evaluate("w4a16_gemm", bug, ["smoke_m5_n136_k256_extreme"], integrity=False).candidate.results[0]
    assert r.status.value == "incorrect" and "y:reference:rel_fro" in r.cause, r.cause


def test_rmsnorm_skipped_residual_update_fails(tmp_path):
    bug = _variant("fused_add_rmsnorm_fp8_quant", tmp_path, "    tl.store(r_ptrs, z, mask=m3)\n", "", base="expert")
    r = _evaluate("fused_add_rmsnorm_fp8_quant", bug, ["smoke_t7_h384_col"], integrity=False).candidate.results[0]
    assert r.status.value == "incorrect" and "state:residual:reference:exact" in r.cause, r.cause


def test_rmsnorm_unrounded_residual_and_dropped_eps_fail(tmp_path):
    bug = _variant("fused_add_rmsnorm_fp8_quant", tmp_path, "zf = z.to(tl.float32)\n",
                   "zf = x.to(tl.float32) + res.to(tl.float32)\n", base="expert")
    r = _evaluate("fused_add_rmsnorm_fp8_quant", bug, ["smoke_t7_h384_col"], integrity=False).candidate.results[0]
    assert r.status.value == "incorrect" and "x_q:reference:ulp" in r.cause, r.cause
    bug = _variant("fused_add_rmsnorm_fp8_quant", tmp_path, "rstd = tl.rsqrt(sumsq / H + eps)", "rstd = tl.rsqrt(sumsq / H)",
                   base="expert")
    r = _evaluate("fused_add_rmsnorm_fp8_quant", bug, ["smoke_t6_h512_magnitudes"], integrity=False).candidate.results[0]
    assert r.status.value == "incorrect", r.cause
