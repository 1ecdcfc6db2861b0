"""Unit tests of the integrity building blocks that need no worker process: operator
classification and the dispatch monitor, the profiler analysis (on synthetic kernel records),
the roofline floor, file hashes, input perturbation, the audit hook (in a subprocess), the
launch counter under the interpreter, and the bookkeeping of rules, catalogue and evil suite."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from d2kbench.harness.results import TimingStats
from d2kbench.integrity import gpu, ops
from d2kbench.integrity.evil import EVIL_DIR, discover, read_expect
from d2kbench.integrity.parent import FileWatch, below_sol_floor, harness_files, perturb
from d2kbench.integrity.rules import RULES
from d2kbench.tasks import load_task

DOCS = Path(__file__).resolve().parents[1] / "docs" / "integrity.md"


# ------------------------------------------------------------------------------- ATen operators
@pytest.mark.parametrize("name, kind", [
    ("aten::mm", "forbidden"), ("aten::bmm", "forbidden"), ("aten::addmm", "forbidden"), ("aten::baddbmm", "forbidden"),
    ("aten::_scaled_dot_product_flash_attention", "forbidden"), ("aten::_scaled_mm", "forbidden"),
    ("aten::convolution", "forbidden"), ("aten::_linalg_svd", "forbidden"), ("aten::linalg_qr", "forbidden"),
    ("aten::_cudnn_rnn", "forbidden"), ("aten::empty", "glue"), ("aten::empty_strided", "glue"), ("aten::copy_", "glue"),
    ("aten::_to_copy", "glue"), ("aten::transpose", "glue"), ("aten::set_", "glue"), ("aten::new_empty", "glue"),
    ("aten::fill_", "glue"), ("aten::_local_scalar_dense", "glue"), ("aten::add", "compute"), ("aten::mul", "compute"),
    ("aten::sum", "compute"), ("aten::linalg_vector_norm", "forbidden"), ("aten::sort", "compute"),
])
def test_classify(name, kind):
    assert ops.classify(name) == kind


def test_task_forbidden_ops_extend_the_list():
    assert ops.classify("aten::cumsum") == "compute"
    assert ops.classify("aten::cumsum", frozenset({"aten::cumsum"})) == "forbidden"
    assert ops.classify("aten::cumsum", frozenset({"cumsum"})) == "forbidden"


def test_dispatch_monitor_sees_through_spellings():
    """@, matmul, einsum and F.linear all reach the monitor as ATen products."""
    a = torch.randn(2, 4, 4)
    mode, seen = ops.make_op_monitor()
    with mode:
        _ = a @ a
        _ = torch.einsum("bij,bjk->bik", a, a)
        _ = torch.nn.functional.linear(a[0], a[0])
        _ = torch.empty(3).fill_(1.0)
    kinds = {ops.classify(n) for n in seen}
    assert "forbidden" in kinds
    rules = dict(ops.judge(seen))
    assert "aten::bmm" in rules["forbidden_op"]
    assert not any(n in rules["forbidden_op"] for n in ("aten::empty", "aten::fill_"))


def test_monitor_keeps_its_counter_out_of_reach():
    mode, seen = ops.make_op_monitor()
    assert not any(isinstance(v, dict) for v in vars(mode).values())


# ------------------------------------------------------------------------------- profiler analysis
def _w(i, t0, t1, ev_ms):
    return gpu.Window(i, t0, t1, ev_ms)


def test_analyse_honest_call_has_no_findings():
    ks = [gpu.KernelRecord("_bgemm_kernel", 1_000, 51_000, stream=7),
          gpu.KernelRecord("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", 500, 900, 7),
          gpu.KernelRecord("Memcpy HtoD", 100, 200, 7, kind="memcpy")]
    findings, summary = gpu.analyse(ks, [_w(0, 0, 100_000, 0.055)], {"_bgemm_kernel"}, timed_mean_ms=0.05)
    assert findings == []
    assert summary["calls"][0]["busy_ms"] == pytest.approx(0.0505)  # 50 us + 0.4 us + 0.1 us


def test_analyse_side_stream_is_hidden_work():
    ks = [gpu.KernelRecord("_bgemm_kernel", 10_000, 110_000, stream=13)]  # 100 us on a side stream
    findings, _ = gpu.analyse(ks, [_w(0, 0, 200_000, 0.004)], {"_bgemm_kernel"}, timed_mean_ms=0.004)
    rules = {r for r, _ in findings}
    assert {"hidden_work", "timing_inconsistent"} <= rules


def test_analyse_late_kernels_are_hidden_work():
    ks = [gpu.KernelRecord("_k", 1_000, 2_000), gpu.KernelRecord("_k", 300_000, 400_000)]
    findings, _ = gpu.analyse(ks, [_w(0, 0, 100_000, 0.01)], {"_k"})
    assert any(r == "hidden_work" and "after run() had returned" in e for r, e in findings)


@pytest.mark.parametrize("name, rule", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "forbidden_kernel"),
    ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NNN", "forbidden_kernel"),
    ("cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm>", "forbidden_kernel"),
    ("flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", "forbidden_kernel"),
    ("triton_poi_fused_add_mul_0", "forbidden_kernel"),
    ("my_cupy_raw_kernel", "foreign_kernel"),
])
def test_analyse_kernel_names(name, rule):
    ks = [gpu.KernelRecord("_mine", 1_000, 2_000), gpu.KernelRecord(name, 3_000, 4_000)]
    findings, _ = gpu.analyse(ks, [_w(0, 0, 10_000, 0.01)], {"_mine"})
    assert rule in {r for r, _ in findings}


def test_solution_kernel_named_like_a_vendor_kernel_is_its_own():
    ks = [gpu.KernelRecord("_bgemm_kernel", 1_000, 2_000)]
    assert gpu.analyse(ks, [_w(0, 0, 10_000, 0.01)], {"_bgemm_kernel"})[0] == []


def test_analyse_without_triton_kernels():
    ks = [gpu.KernelRecord("void at::native::copy_kernel", 1_000, 2_000)]
    findings, _ = gpu.analyse(ks, [_w(0, 0, 10_000, 0.01)], set())
    assert [r for r, _ in findings] == ["no_triton_kernel"]


def test_busy_time_merges_overlaps_across_streams():
    ks = [gpu.KernelRecord("a", 0, 10_000, 1), gpu.KernelRecord("b", 5_000, 15_000, 2),
          gpu.KernelRecord("c", 20_000, 21_000, 1)]
    assert gpu.busy_ms(ks) == pytest.approx(0.016)


def test_graph_kernel_comparison():
    empty = gpu.compare_graph([], {"_k": 1}, 8, {"_k"})
    assert empty and empty[0][0] == "graph_kernel_mismatch"
    full = [gpu.KernelRecord("_k", i, i + 1) for i in range(8)]
    assert gpu.compare_graph(full, {"_k": 1}, 8, {"_k"}) == []
    assert gpu.compare_graph(full[:4], {"_k": 1}, 8, {"_k"})[0][0] == "graph_kernel_mismatch"


def test_l2_probe_is_none_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("covered by the GPU test")
    assert gpu.persisting_l2_limit() is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: the persisting-L2 probe needs the CUDA runtime")
def test_l2_probe_reads_the_set_aside_cuda():
    torch.zeros(1, device="cuda")
    assert gpu.persisting_l2_limit() is not None


# ------------------------------------------------------------------------------- parent checks
def _stats(ms: float) -> TimingStats:
    return TimingStats(mode="events", samples_ms=[ms], n=1, mean_ms=ms, median_ms=ms, std_ms=0, p10_ms=ms, p90_ms=ms,
                       min_ms=ms, max_ms=ms, ci95_low_ms=ms, ci95_high_ms=ms)


def test_below_sol_floor():
    task = load_task("muon_newton_schulz")
    wl = task.spec.workload("paper_32x2048x5464")
    v = below_sol_floor(task, wl, _stats(0.01), "NVIDIA H200")
    assert v is not None and v.rule == "below_sol_floor" and "gram_symmetric" in v.evidence
    assert below_sol_floor(task, wl, _stats(100.0), "NVIDIA H200") is None
    assert below_sol_floor(task, wl, _stats(0.01), None) is None  # CPU: no floor
    assert below_sol_floor(task, wl, _stats(0.01), "Some Other GPU") is None


def test_file_watch_reports_a_change_once(tmp_path):
    f = tmp_path / "timing.py"
    f.write_text("x = 1\n")
    watch = FileWatch([f])
    assert watch.changes() == []
    f.write_text("x = 2\n")
    changed = watch.changes()
    assert [v.rule for v in changed] == ["harness_tampering"] and "timing.py" in changed[0].evidence
    assert watch.changes() == []


def test_harness_files_cover_worker_code_and_task():
    task = load_task("muon_newton_schulz")
    names = {p.name for p in harness_files(task.root)}
    assert {"worker.py", "timing.py", "evaluate.py", "guard.py", "audit.py", "reference.py", "task.yaml"} <= names


def test_perturb_changes_exactly_one_element():
    import secrets

    task = load_task("muon_newton_schulz")
    ref = task.reference_module()
    args = [ref.make_inputs({"B": 2, "M": 8, "N": 16}, 1, "cpu")["G"], 5]
    new, desc = perturb(args, task.spec.args, secrets.SystemRandom(), 2.0)
    diff = (new[0].float() != args[0].float())
    assert int(diff.sum()) == 1 and desc.startswith("G[")
    assert new[1] == 5 and args[0] is not new[0]
    assert perturb([5], task.spec.args[1:], secrets.SystemRandom(), 1.0) is None


# ------------------------------------------------------------------------------- audit hook
AUDIT_SCRIPT = textwrap.dedent('''
    import json, os, sys, collections, tempfile
    from d2kbench.integrity import audit
    sol = sys.argv[1]
    protected = sys.argv[2]
    rec = audit.install(sol, [protected])
    rec.arm()
    results = {}
    def solution_code(src):
        exec(compile(src, sol, "exec"), {"__name__": "sol"})
    for name, src in [
        ("getframe", "import sys; sys._getframe(0)"),
        ("tb_frame", "try:\\n    1/0\\nexcept ZeroDivisionError as e:\\n    e.__traceback__.tb_frame"),
        ("gc", "import gc; gc.get_objects()"),
        ("ctypes", "import ctypes; ctypes.CDLL(None)"),
        ("kill_parent", "import os; os.kill(os.getppid(), 0)"),
        ("write_protected", f"open({os.path.join(protected, 'x.py')!r}, 'a')"),
        ("namedtuple", "import collections; collections.namedtuple('P', 'a b')"),
        ("write_elsewhere", f"open({os.path.join(tempfile.gettempdir(), 'd2k_audit_probe.txt')!r}, 'w').close()"),
    ]:
        try:
            solution_code(src)
            results[name] = "allowed"
        except PermissionError:
            results[name] = "refused"
    rec.disarm()
    import gc; gc.get_objects()  # the harness itself, disarmed: allowed
    results["recorded"] = sorted({r for r, _ in rec.drain()})
    print(json.dumps(results))
''')


def test_audit_hook_refuses_solution_introspection_and_records_it(tmp_path):
    sol = tmp_path / "solution.py"
    sol.write_text("")
    protected = tmp_path / "harness"
    protected.mkdir()
    out = subprocess.run([sys.executable, "-c", AUDIT_SCRIPT, str(sol), str(protected)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")})
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    for name in ("getframe", "tb_frame", "gc", "ctypes", "kill_parent", "write_protected"):
        assert res[name] == "refused", (name, res)
    assert res["namedtuple"] == "allowed" and res["write_elsewhere"] == "allowed"
    assert res["recorded"] == ["ctypes", "harness_tampering", "introspection", "process_control"]
    assert not (protected / "x.py").exists()


# ------------------------------------------------------------------------------- launch counter
def test_launch_counter_counts_interpreted_launches(tmp_path):
    script = textwrap.dedent('''
        import os, sys
        os.environ["TRITON_INTERPRET"] = "1"
        import torch, triton, triton.language as tl
        from d2kbench.integrity.guard import _Launches
        counter = _Launches()
        @triton.jit
        def _copy(a, o, n, B: tl.constexpr):
            i = tl.arange(0, B)
            tl.store(o + i, tl.load(a + i, mask=i < n), mask=i < n)
        a = torch.arange(8.0); o = torch.empty(8)
        _copy[(1,)](a, o, 8, B=8); _copy[(1,)](a, o, 8, B=8)
        print(dict(counter.take()), bool((o == a).all()))
    ''')
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "{'_copy': 2} True"


# ------------------------------------------------------------------------------- bookkeeping
def test_every_catalogue_entry_is_answered():
    """Each of the 33 catalogue entries has a rule, an evil solution, or a documented reason in
    docs/integrity.md why the design makes it impossible."""
    by_rules = {c for r in RULES.values() for c in r.catalogue}
    by_evil = {c for case in discover(EVIL_DIR, "cuda") for c in case.expect["catalogue"]}
    text = DOCS.read_text()
    documented = {int(m) for m in re.findall(r"^\| (\d+) \|", text, flags=re.M)}
    assert documented == set(range(1, 34)), sorted(set(range(1, 34)) - documented)
    assert set(range(1, 34)) - by_rules - by_evil <= {8, 12, 17, 27}  # by construction: see the docs


def test_evil_files_are_well_formed():
    cases = discover(EVIL_DIR, "cuda")
    assert len(cases) >= 35
    for case in cases:
        expect, doc = read_expect(case.path)
        assert doc and ("Catalogue #" in doc or "Control" in doc), case.path
        if expect["status"] == "integrity_violation":
            assert all(r in RULES for r in expect["rule"].split("|")), case.path  # "a|b": either rule
        for r in expect.get("static", []):
            assert r in RULES and r.startswith("ast_"), case.path


def test_rules_are_documented():
    text = DOCS.read_text()
    missing = [name for name in RULES if f"`{name}`" not in text]
    assert not missing


def test_parent_recomputes_timing_statistics():
    from d2kbench.harness.timing import summarize
    from d2kbench.integrity.parent import stats_inconsistency

    honest = summarize([1.0, 2.0, 3.0], "cpu")
    assert stats_inconsistency(honest) == ""
    forged = honest.model_copy(update={"mean_ms": 0.002})
    assert "mean reported" in stats_inconsistency(forged)
    assert "samples" in stats_inconsistency(honest.model_copy(update={"n": 7}))


def test_perturb_handles_fp8_inputs():
    """FP8 tensors have no abs/max kernels: the perturbation works in float32."""
    import secrets

    from d2kbench.tasks.schema import TensorArg

    spec = [TensorArg(name="x", kind="tensor", shape=["N"], dtype="float8_e4m3fn")]
    x = torch.randn(64).to(torch.float8_e4m3fn)
    new, desc = perturb([x], spec, secrets.SystemRandom(), 1.0)
    assert int((new[0].float() != x.float()).sum()) == 1 and desc.startswith("x[")


def test_perturbation_scale_ignores_nan_slots_and_handles_fp8():
    """Paged caches hold NaN in unused slots and FP8 has no abs kernel on the GPU: the scale of a
    perturbation must stay finite (a NaN scale would write NaN into a used slot)."""
    x = torch.tensor([float("nan"), -3.0, 2.0, float("inf")])
    assert ops.finite_abs_max(x) == 3.0
    assert ops.finite_abs_max(torch.full((4,), float("nan"))) == 1.0
    f8 = torch.tensor([0.5, -448.0, 2.0]).to(torch.float8_e4m3fn)
    assert ops.finite_abs_max(f8) == 448.0


def test_guard_install_does_not_import_dynamo_but_still_wraps_torch_compile():
    """Installing the worker's guard must not pull in torch._dynamo/_inductor (seconds per
    worker); torch.compile is still wrapped and a solution's own import of dynamo is refused."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import sys, time
        import torch
        from d2kbench.tasks.loader import import_file, load_task
        from d2kbench.integrity.guard import Guard
        task = load_task("muon_newton_schulz")
        ref = import_file(task.root / "reference.py", "d2k_task_reference")
        g = Guard("cpu", str(task.resolve_solution("straightforward")), task, ref, trusted=False)
        g.install()
        g.audit.disarm()
        print(sorted(m for m in ("torch._dynamo", "torch._inductor") if m in sys.modules),
              getattr(torch.compile, "_d2k_wrapped", False), "torch.compile" in g.snapshot)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "[] True True"


def test_solution_scope_excludes_libraries_and_the_harness_beside_the_solution():
    """A solution kept in a project root next to its virtual environment (or the harness's
    sources) must not make PyTorch or d2kbench frames count as the solution's own code."""
    import os
    from pathlib import Path

    import torch

    from d2kbench.integrity.audit import _stdlib_dirs, is_solution_file, solution_scope

    site = next(d for d in _stdlib_dirs()[1] if os.path.isdir(d))
    torch_file = os.path.realpath(torch.__file__)
    assert torch_file.startswith(site)
    root_solution = str(Path(site).parent / "my_solution.py")  # a folder that contains site-packages
    scope = solution_scope(root_solution)
    assert is_solution_file(os.path.realpath(root_solution), scope)
    assert is_solution_file(str(Path(site).parent / "helper.py"), scope)  # its own helper module
    assert not is_solution_file(torch_file, scope)
    import d2kbench.harness.timing as timing

    repo_solution = str(Path(timing.__file__).resolve().parents[2] / "my_solution.py")  # next to src/d2kbench
    assert not is_solution_file(os.path.realpath(timing.__file__), solution_scope(repo_solution))
    shipped = Path(timing.__file__).resolve().parents[1] / "suite" / "muon_newton_schulz" / "solutions" / "expert.py"
    shipped_scope = solution_scope(str(shipped))  # a solution inside the package keeps its own folder
    assert is_solution_file(str(shipped.parent / "_helper.py"), shipped_scope)
    assert not is_solution_file(os.path.realpath(timing.__file__), shipped_scope)
