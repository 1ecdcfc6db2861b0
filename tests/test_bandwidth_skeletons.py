"""devtools/bandwidth_skeletons.py: the read skeletons move exactly the tasks' SOL bytes.

The skeletons run under the CPU interpreter on small workloads of the tasks' own generators;
:func:`count_bytes` records every masked load and store and counts the distinct bytes of each
input and output buffer. Their sum must equal the task's floor SOL byte formula (up to the
formulas' documented rounding of index metadata, ``SLACK``), and skeletons given wrong
parameters (reading NaN rows past a request's end, the prefix once per request, tokens
without an adapter) must fail the same check.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from d2kbench.checking.inputs import make_args
from d2kbench.tasks import load_task
from d2kbench.tasks.schema import Workload

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")

_PATH = Path(__file__).resolve().parents[1] / "devtools" / "bandwidth_skeletons.py"


@pytest.fixture(scope="module")
def bs():
    spec = importlib.util.spec_from_file_location("bandwidth_skeletons", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


#: Small fp16 workloads (uniform antithetic lengths, prefix on a page boundary: the registered
#: workloads' properties the SOL formulas rely on); mla H 24 has two head blocks of 16 rows (the
#: second one partly masked; each re-reads the latent, from the L2 on the GPU),
#: lora T 96 the two-phase sort (64-token chunks), cascade the prefix and suffix programs.
CASES = [
    ("mla_decode_absorbed", {"B": 4, "H": 4, "DN": 32, "DR": 16, "DL": 64, "DV": 32, "NP": 24, "PS": 16, "MAXP": 4}),
    ("mla_decode_absorbed", {"B": 2, "H": 24, "DN": 32, "DR": 16, "DL": 64, "DV": 32, "NP": 12, "PS": 16, "MAXP": 4}),
    ("cascade_prefix_decode", {"N": 6, "Hq": 4, "Hkv": 2, "D": 32, "NB": 40, "BS": 16, "MAXB": 6, "P": 32}),
    ("lora_shrink_expand", {"T": 24, "K": 64, "N": 64, "R": 16, "L": 4, "S": 3}),
    ("lora_shrink_expand", {"T": 96, "K": 64, "N": 80, "R": 16, "L": 2, "S": 2}),
]
PARAMS = {"lora_shrink_expand": [{"slices": "32,16,16", "mapping": "random"}, {"slices": "40,40", "mapping": "segmented"}]}


def _case(i: int):
    task_id, axes = CASES[i]
    task = load_task(task_id)
    n_same = sum(1 for t, _ in CASES[:i] if t == task_id)
    params = {"dtype": "float16", **(PARAMS.get(task_id, [{}] * 5)[n_same])}
    wl = Workload(id=f"test_{i}", axes=axes, params=params, source="test")
    args = make_args(task.reference_module(), task.spec, wl, 11 + i, "cpu")
    return task, wl, args, [a.name for a in task.spec.args]


def _moved(counts: dict) -> int:
    return sum(v["read"] + v["written"] for k, v in counts.items() if k != "other")


@pytest.mark.parametrize("i", range(len(CASES)), ids=[f"{t}-{i}" for i, (t, _) in enumerate(CASES)])
def test_skeleton_moves_the_sol_bytes(bs, i):
    task, wl, args, names = _case(i)
    counts = bs.skeleton_bytes(task.spec.id, args, names)
    sol = bs.sol_bytes(task, wl)
    slack = bs.SLACK[task.spec.id](wl.axes)
    assert abs(_moved(counts) - sol) <= slack, (counts, sol)
    # the pattern: the latent / suffix / x rows are requested once per head block / program, the
    # weights and tables are only inputs (no writes), the outputs written once
    if task.spec.id == "mla_decode_absorbed":
        blocks = -(-wl.axes["H"] // 16)                              # the interpreter's 16-row blocks
        assert counts["kv_cache"]["read_requested"] == blocks * counts["kv_cache"]["read"]
        assert counts["o"]["written"] == 2 * wl.axes["B"] * wl.axes["H"] * wl.axes["DV"]
    if task.spec.id == "lora_shrink_expand":
        assert counts["y"]["written"] == counts["y"]["read"] > 0
        assert counts["x"]["read_requested"] == counts["x"]["read"]


def test_cascade_split_prefix_requests_each_byte_once(bs):
    task, wl, args, names = _case(2)
    counts = bs.skeleton_bytes(task.spec.id, args, names, split_prefix=True)
    assert abs(_moved(counts) - bs.sol_bytes(task, wl)) <= bs.SLACK[task.spec.id](wl.axes)
    assert counts["k_cache"]["read_requested"] == counts["k_cache"]["read"]


def test_wrong_skeletons_fail(bs):
    """Skeletons fed wrong parameters move other bytes than the SOL model, and the check sees it."""
    # mla: lengths rounded up to whole pages -> NaN rows past each request's end are read
    task, wl, args, names = _case(0)
    bad = list(args)
    ps = wl.axes["PS"]
    bad[4] = ((args[4] + ps - 1) // ps * ps).to(torch.int32)
    assert bool((bad[4] != args[4]).any())
    assert abs(_moved(bs.skeleton_bytes(task.spec.id, bad, names)) - bs.sol_bytes(task, wl)) > bs.SLACK[task.spec.id](wl.axes)
    # cascade: the prefix passed as 0 -> every request reads the shared prefix itself (plain paged decode)
    task, wl, args, names = _case(2)
    bad = list(args)
    bad[5] = 0
    assert abs(_moved(bs.skeleton_bytes(task.spec.id, bad, names)) - bs.sol_bytes(task, wl)) > bs.SLACK[task.spec.id](wl.axes)
    # lora: tokens without an adapter given adapter 0 -> their x and y rows are moved too
    task, wl, args, names = _case(3)
    bad = list(args)
    assert bool((args[5] < 0).any())
    bad[5] = args[5].clamp(min=0)
    bad[1] = args[1].clone()
    assert abs(_moved(bs.skeleton_bytes(task.spec.id, bad, names)) - bs.sol_bytes(task, wl)) > bs.SLACK[task.spec.id](wl.axes)


def test_registered_workloads_exist(bs):
    for task_id, wid in bs.WORKLOADS + bs.COMPUTE:
        assert not load_task(task_id).spec.workload(wid).correctness_only


def _workload_args(task_id: str, axes: dict, params: dict, seed: int = 5):
    task = load_task(task_id)
    wl = Workload(id="test", axes=axes, params=params, source="test")
    return task, wl, make_args(task.reference_module(), task.spec, wl, seed, "cpu"), [a.name for a in task.spec.args]


@pytest.mark.parametrize("axes,params", [
    ({"T": 6, "Hq": 4, "Hkv": 2, "D": 32, "NB": 8, "BS": 4, "MAXPOS": 64}, {"dtype": "float16", "mode": "decode"}),
    ({"T": 37, "Hq": 5, "Hkv": 1, "D": 64, "NB": 24, "BS": 16, "MAXPOS": 128}, {"dtype": "float16"}),
], ids=["decode", "prefill_h5"])
def test_qkv_skeleton_moves_the_sol_bytes(bs, axes, params):
    """Every qkv row read once, q written once, k and v written at the mapped slots only, one
    cos|sin row, position and slot per token: the floor formula with this input's padding count
    (the formula assumes 2%) and distinct positions (the formula counts a row per token)."""
    task, wl, args, names = _workload_args("fused_qkv_norm_rope_cache", axes, params)
    T, Hq, Hkv, D = (axes[a] for a in ("T", "Hq", "Hkv", "D"))
    slots, pos = args[7], args[4]
    valid = int((slots >= 0).sum())
    assert valid < T                                               # some padding: nothing written for it
    counts = bs.skeleton_bytes(task.spec.id, args, names)
    assert counts["qkv"]["read"] == counts["qkv"]["read_requested"] == 2 * T * (Hq + 2 * Hkv) * D
    assert counts["q_out"]["written"] == 2 * T * Hq * D
    assert counts["key_cache"]["written"] == counts["value_cache"]["written"] == 2 * valid * Hkv * D
    assert counts["key_cache"]["read"] == counts["value_cache"]["read"] == 0
    assert counts["cos_sin_cache"]["read_requested"] == 4 * T * D
    assert counts["cos_sin_cache"]["read"] == 4 * D * len(set(pos.tolist()))
    assert counts["positions"]["read"] == counts["slot_mapping"]["read"] == 8 * T
    assert counts["q_norm_weight"]["read"] == counts["k_norm_weight"]["read"] == 0   # L2-resident gains: not SOL
    requested = sum(v["written"] + (v["read_requested"] if k == "cos_sin_cache" else v["read"])
                    for k, v in counts.items() if k != "other")
    sol = bs.sol_bytes(task, wl)
    assert requested - sol == 4 * Hkv * D * (valid - (T - T // 50))
    rd, wr = bs.sol_split(task.spec.id, wl.axes)
    assert rd + wr == sol


@pytest.mark.parametrize("level", [0, 1, 2, 3])
@pytest.mark.parametrize("axes,params", [
    ({"R": 3, "T": 5, "H": 384, "GS": 128, "Q": 1}, {"ydtype": "float8_e4m3fn"}),
    ({"R": 2, "T": 3, "H": 256, "GS": 128, "Q": 0}, {"dtype": "float16", "ydtype": "float16"}),
], ids=["fp8_3_of_4_groups", "fp16"])
def test_allreduce_skeleton_moves_the_sol_bytes(bs, level, axes, params):
    """Each arithmetic level reads every partial, the residual and the gain once and writes the
    residual, y and the scales once: exactly the floor formula, split as :func:`sol_split` says."""
    task, wl, args, names = _workload_args("allreduce_residual_rmsnorm", axes, params)
    counts = bs.skeleton_bytes(task.spec.id, args, names, arith=level)
    R, T, H = axes["R"], axes["T"], axes["H"]
    for r in range(R):
        assert counts[f"partials_{r}"]["read"] == counts[f"partials_{r}"]["read_requested"] == 2 * T * H
    assert counts["residual"]["read"] == counts["residual"]["written"] == 2 * T * H
    rd, wr = bs.sol_split(task.spec.id, wl.axes)
    assert sum(v["read"] for k, v in counts.items() if k != "other") == rd
    assert sum(v["written"] for k, v in counts.items() if k != "other") == wr
    assert rd + wr == bs.sol_bytes(task, wl)
    assert counts["other"]["read"] == counts["other"]["written"] == 0


@pytest.mark.parametrize("rd,wr,programs", [(6000, 5000, 3), (4000, 9000, 5)])
def test_flat_copy_moves_the_split_bytes(bs, rd, wr, programs):
    """The contiguous copy reads ``rd`` and writes ``wr`` bytes, each element once, whatever the
    program count (a partial last tile, more writes than reads)."""
    call = bs.flat_copier(rd, wr, "cpu", programs, 1, block=256)
    counts = bs.count_bytes(lambda: call(0), call.buffers)
    assert counts["src"]["read"] == counts["src"]["read_requested"] == rd
    assert counts["dst"]["written"] == wr
    assert counts["other"]["read"] == counts["other"]["written"] == 0
# ------------------------------------------------ topk_topp_sampling: the sampler's read skeletons
#: fp32 smoke-sized sampler workloads: language-model rows with both filters, and masked rows
#: (-inf logits, which the skeleton must still read once).
TOPK_CASES = [({"B": 3, "V": 1000}, {"filters": "kp"}), ({"B": 5, "V": 700}, {"filters": "mixed", "variant": "masked"})]


def _topk_case(i: int):
    task = load_task("topk_topp_sampling")
    axes, params = TOPK_CASES[i]
    wl = Workload(id=f"topk_test_{i}", axes=axes, params=params, source="test")
    args = make_args(task.reference_module(), task.spec, wl, 7 + i, "cpu")
    return task, wl, args, [a.name for a in task.spec.args]


@pytest.mark.parametrize("row_program", [False, True], ids=["expert_grid", "row_program"])
@pytest.mark.parametrize("i", range(len(TOPK_CASES)))
def test_topk_skeleton_moves_the_sol_bytes(bs, i, row_program):
    """Both grids (the expert's row splits, one program per row) read every logit once, the four
    parameters once per row and write one int64 id per row: 4 B V + 24 B bytes, the SOL."""
    task, wl, args, names = _topk_case(i)
    counts = bs.skeleton_bytes(task.spec.id, args, names, row_program=row_program)
    assert _moved(counts) == bs.sol_bytes(task, wl) == 4 * wl.axes["B"] * wl.axes["V"] + 24 * wl.axes["B"]
    assert counts["logits"]["read_requested"] == counts["logits"]["read"] == 4 * wl.axes["B"] * wl.axes["V"]
    assert counts["ids"]["written"] == 8 * wl.axes["B"] and counts["other"]["written"] == 0


def test_topk_skeleton_missing_a_split_fails(bs):
    """An expert grid with one split too few (the rows' last chunks never read) moves fewer bytes
    than the SOL model, and the byte check sees it."""
    task, wl, args, names = _topk_case(0)
    from d2kbench.tasks.loader import import_file

    expert = import_file(task.resolve_solution("expert"))

    class Short:
        @staticmethod
        def _config(B, V):
            cfg = dict(expert._config(B, V))
            cfg["S"] -= 1
            return cfg

    _, call = bs.topk_skeleton(Short, args, 4)
    counts = bs.count_bytes(call, {**dict(zip(names, args)), **call.outputs})
    cfg = expert._config(wl.axes["B"], wl.axes["V"])
    read = 4 * wl.axes["B"] * (cfg["S"] - 1) * cfg["NT"] * cfg["TILE"]
    assert counts["logits"]["read"] == read < 4 * wl.axes["B"] * wl.axes["V"]
    assert _moved(counts) < bs.sol_bytes(task, wl)


def test_topk_expert_parts_are_the_expert(bs):
    """The expert's kernel taken apart: ``scan`` reads every logit and writes no id; ``finalise``
    after it samples exactly the expert's ids."""
    task, wl, args, names = _topk_case(1)
    from d2kbench.tasks.loader import import_file

    expert = import_file(task.resolve_solution("expert"))
    ids = expert.run(*args)
    parts = bs.topk_expert_parts(expert, args, 4)
    counts = bs.count_bytes(parts["scan"][1], dict(zip(names, args)))
    assert counts["logits"]["read"] == 4 * wl.axes["B"] * wl.axes["V"]
    assert counts["top_k"]["read"] == counts["top_p"]["read"] == counts["uniforms"]["read"] == 0   # no finaliser
    assert torch.equal(parts["finalise"][1](), ids)
    # the split pass as its own kernel fills the scratch exactly as the expert's kernel does
    S = expert._config(wl.axes["B"], wl.axes["V"])["S"]
    cx, ci, stats, cnt = (t.clone() for t in parts["finalise"][1].scratch)
    own = bs.topk_expert_parts(expert, args, 4)
    for buf in own["finalise"][1].scratch:
        buf.fill_(-1)
    own["split_pass"][1]()
    cx2, ci2, stats2, cnt2 = own["finalise"][1].scratch
    assert S > 1 and torch.equal(cnt2[:, :S], cnt[:, :S]) and torch.equal(stats2[:, :S], stats[:, :S])
    live = torch.arange(cx.shape[2])[None, None, :] < cnt[:, :, None].clamp(max=cx.shape[2])
    live[:, S:] = False
    assert int(live.sum()) > 0 and torch.equal(cx2[live], cx[live]) and torch.equal(ci2[live], ci[live])
    assert torch.equal(own["finalise"][1](), ids)
    # smaller tiles (another threshold estimate: other candidates, the same ids), with and without
    # the prefetch of the next tile: the same scratch
    got = []
    for kind in ("split_pass_small_tile", "split_pass_prefetch"):
        for buf in own["finalise"][1].scratch:
            buf.fill_(-1)
        own[kind][1]()
        got.append([t.clone() for t in own["finalise"][1].scratch])
        assert torch.equal(own["finalise"][1](), ids)
    assert all(torch.equal(a, b) for a, b in zip(*got))
# ------------------------------------------------ w4a16_gemm: the decode kernel's read skeleton
W4_CASES = [({"M": 1, "N": 256, "K": 512, "G": 128}, {}),
            ({"M": 5, "N": 136, "K": 256, "G": 128}, {"variant": "extreme"})]


@pytest.mark.parametrize("level", [0, 1, 2])
@pytest.mark.parametrize("axes,params", W4_CASES, ids=["m1_split", "m5_ragged_extreme"])
def test_w4a16_skeleton_moves_the_sol_bytes(bs, level, axes, params):
    """Every arithmetic level reads each packed word once, x, the zero points and scales of every
    group, and writes y once: exactly the floor formula (ragged N / 8 and M masked)."""
    task, wl, args, names = _workload_args("w4a16_gemm", axes, params)
    M, N, K, G = (axes[a] for a in ("M", "N", "K", "G"))
    counts = bs.skeleton_bytes(task.spec.id, args, names, level=level)
    assert counts["qweight"]["read"] == counts["qweight"]["read_requested"] == K * N // 2
    assert counts["x"]["read"] == 2 * M * K
    assert counts["qzeros"]["read"] == (K // G) * N // 2 and counts["scales"]["read"] == 2 * (K // G) * N
    assert counts["y"]["written"] == 2 * M * N
    assert counts["other"]["read"] == counts["other"]["written"] == 0
    assert _moved(counts) == bs.sol_bytes(task, wl)


def test_w4a16_dequant_mma_level_is_the_gemm(bs):
    """Level 2 (the expert's unpacking and 8 MMAs) without a split computes y itself: the
    skeleton's arithmetic is the real dequantisation, not a stand-in. The prefill shape (the
    expert's compute-bound kernel) has no skeleton."""
    task, wl, args, names = _workload_args("w4a16_gemm", *W4_CASES[1])
    from d2kbench.tasks.loader import import_file

    expert = import_file(task.resolve_solution("expert"))
    _, call = bs.w4a16_skeleton(expert, args, 0, level=2)          # 0 SMs: the plan's split is 1
    y = call().float()
    ref = task.reference_module().run(*args).float()
    assert float((y - ref).norm() / ref.norm()) < 1e-4
    _, call0 = bs.w4a16_skeleton(expert, args, 0, level=0)
    assert float((call0().float() - ref).norm() / ref.norm()) > 0.1   # level 0 moves bytes, computes nothing
    big = [torch.empty((4096, 256), dtype=torch.float16), torch.empty((256, 512), dtype=torch.int32),
           torch.empty((2, 512), dtype=torch.int32), torch.empty((2, 4096), dtype=torch.float16), 128]
    with pytest.raises(ValueError, match="decode"):
        bs.w4a16_skeleton(expert, big, 132)
