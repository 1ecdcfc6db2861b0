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

from d2kbench.harness.evil import EVIL_DIR, discover, read_expect
from d2kbench.integrity import gpu, ops
from d2kbench.integrity.parent import FileWatch, below_sol_floor, harness_files, perturb
from d2kbench.integrity.rules import RULES
from d2kbench.results import TimingStats
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
    mode, log = ops.make_op_monitor()
    seen = log.ops
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
    mode, _log = ops.make_op_monitor()
    assert not any(isinstance(v, (dict, ops.OpLog)) for v in vars(mode).values())


def test_cpu_monitors_record_ops_without_loading_dynamo():
    """A CPU correctness call's monitors (dispatch monitor, Kineto profiler) record the call's
    ATen ops without importing Dynamo or Inductor: PyTorch's wrappers would otherwise import them
    in every worker's first call (seconds each on 2 cores). Once Dynamo is loaded the monitor
    is Dynamo-disabled as PyTorch does by default. In a fresh interpreter (pytest may hold Dynamo)."""
    code = textwrap.dedent("""
        import sys, torch
        from d2kbench.integrity import ops
        from d2kbench.integrity.guard import _CpuOpProfile
        mode, log = ops.make_op_monitor()
        prof = _CpuOpProfile()
        prof.start()
        with mode:
            torch.ones(4).add_(1.0).sum()
        seen = prof.stop()
        loaded = [m for m in ("torch._dynamo", "torch._inductor") if m in sys.modules]
        assert not loaded, loaded
        assert log.ops["aten::add_"] == 1 and seen["aten::add_"] >= 1, (dict(log.ops), dict(seen))
        assert not type(mode)._should_skip_dynamo()
        import torch._dynamo
        assert ops.make_op_monitor()[0]._should_skip_dynamo()
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [str(Path(__file__).resolve().parents[1] / "src"),
                                                                    os.environ.get("PYTHONPATH", "")] if p)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]


def test_host_compute_limits_scalar_reads_and_device_to_host_bytes():
    """Many ``.item()`` reads in one call are host compute; a few (launch planning) are not."""
    t = torch.arange(200.0)
    mode, log = ops.make_op_monitor()
    with mode:
        lens = [int(t[i]) for i in range(8)]
    assert lens[-1] == 7 and log.scalar_reads == 8 and ops.judge_host(log) == []
    with mode:
        total = sum(float(t[i]) for i in range(200))
    assert total == sum(range(200)) and log.scalar_reads == 208
    assert [r for r, _ in ops.judge_host(log)] == ["host_compute"]
    log.clear()
    log.host_bytes = ops.MAX_HOST_BYTES + 1
    assert "bytes from the GPU to the host" in ops.judge_host(log)[0][1]


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
    import torch.cuda  # imported before arming, as in a worker (importing torch dlopens itself)
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
        ("ctypes_through_a_library", "import ctypes, functools; from torch.utils._pytree import tree_map; "
                                     "tree_map(functools.partial(ctypes.string_at, size=8), [id(tree_map)])"),
        ("proc_self_mem", "open('/proc/self/mem', 'rb').close()"),
        ("proc_mem_by_dir_fd", "import os; d = os.open('/proc/self', os.O_RDONLY); os.open('mem', os.O_RDONLY, dir_fd=d)"),
        ("symlink_to_mem", f"import os; os.symlink('/dev/fd/../mem', {os.path.join(tempfile.mkdtemp(), 'x')!r})"),
        ("proc_self_status", "open('/proc/self/status').read()"),
        ("namedtuple", "import collections; collections.namedtuple('P', 'a b')"),
        ("torch_nvml_count", "import torch.cuda\\ntry:\\n    torch.cuda._raw_device_count_nvml()\\n"
                             "except PermissionError:\\n    raise\\n"
                             "except OSError:\\n    pass  # no NVML on this machine: the load was allowed"),
        ("nvml_name_spoofed", "import ctypes\\ndef _raw_device_count_nvml():\\n    ctypes.CDLL(None)\\n"
                              "_raw_device_count_nvml()"),
        ("write_elsewhere", f"open({os.path.join(tempfile.gettempdir(), 'd2k_audit_probe.txt')!r}, 'w').close()"),
        # code compiled at run time names any file and function: PyTorch's, a library's, the standard library's
        ("nvml_file_forged", "import ctypes\\nns = {}\\nexec(compile('import ctypes\\\\ndef _raw_device_count_nvml():\\\\n"
                             "    ctypes.CDLL(None)\\\\n', '/opt/x/torch/cuda/__init__.py', 'exec'), ns)\\n"
                             "ns['_raw_device_count_nvml']()"),
        ("nvml_code_replaced", "import ctypes, types, torch.cuda\\ndef f():\\n    ctypes.CDLL(None)\\n"
                               "real = torch.cuda._raw_device_count_nvml.__code__\\n"
                               "types.FunctionType(f.__code__.replace(co_filename=real.co_filename, "
                               "co_name=real.co_name), {'ctypes': ctypes})()"),
        ("nvml_ctypes_poisoned", "import ctypes, sys, types, torch.cuda\\n"
                                 "class L(ctypes.CDLL):\\n    _name = property(lambda s: None, lambda s, v: None)\\n"
                                 "fake = types.ModuleType('ctypes'); fake.__dict__.update(vars(ctypes)); fake.CDLL = L\\n"
                                 "sys.modules['ctypes'] = fake\\ntry:\\n    torch.cuda._raw_device_count_nvml()\\n"
                                 "except AttributeError:\\n    pass\\nfinally:\\n    sys.modules['ctypes'] = ctypes"),
        ("gc_file_forged", "ns = {}\\nexec(compile('import gc\\\\ndef g():\\\\n    return gc.get_objects()\\\\n', "
                           "'/opt/x/numpy/core/_methods.py', 'exec'), ns)\\nns['g']()"),
        ("getframe_as_collections", "ns = {}\\nexec(compile('import sys\\\\ndef g():\\\\n    return sys._getframe(1)\\\\n', "
                                    "'/opt/x/collections/__init__.py', 'exec'), ns)\\nns['g']()"),
        ("marshal_forged", "import marshal\\nc = compile('import gc\\\\ndef g():\\\\n    return gc.get_objects()\\\\n', "
                           "'/opt/y/site-packages/torch/_utils.py', 'exec')\\nns = {}\\n"
                           "exec(marshal.loads(marshal.dumps(c)), ns)\\nns['g']()"),
        ("nvml_globals_forged", "import builtins, ctypes, types, torch.cuda\\n"
                                "real = torch.cuda._raw_device_count_nvml\\n"
                                "def imp(name, *a, **k):\\n    return builtins.__import__(name, *a, **k)\\n"
                                "g = {'__builtins__': {'__import__': imp}, 'warnings': __import__('warnings')}\\n"
                                "try:\\n    types.FunctionType(real.__code__, g)()\\nexcept PermissionError:\\n    raise\\n"
                                "except OSError:\\n    pass  # no NVML here: the load was allowed"),
        ("nvml_import_poisoned", "import builtins, ctypes, torch.cuda\\nreal = builtins.__import__\\n"
                                 "def imp(name, *a, **k):\\n    return real(name, *a, **k)\\n"
                                 "builtins.__import__ = imp\\ntry:\\n    torch.cuda._raw_device_count_nvml()\\n"
                                 "except PermissionError:\\n    raise\\nexcept OSError:\\n    pass\\n"
                                 "finally:\\n    builtins.__import__ = real"),
        ("compile_laundered", "import functools\\nfrom torch.utils._pytree import tree_map\\n"
                              "[c] = tree_map(functools.partial(compile, filename='/opt/z/helpers.py', mode='exec'), "
                              "['import gc\\\\ndef g():\\\\n    return gc.get_objects()\\\\n'])\\nns = {}\\nexec(c, ns)\\n"
                              "ns['g']()"),
    ]:
        try:
            solution_code(src)
            results[name] = "allowed"
        except PermissionError:
            results[name] = "refused"
    try:  # a process's memory file is refused whoever opens it while the hook is armed
        open("/proc/self/mem", "rb").close()
        results["harness_proc_mem"] = "allowed"
    except PermissionError:
        results["harness_proc_mem"] = "refused"
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
    for name in ("getframe", "tb_frame", "gc", "ctypes", "kill_parent", "write_protected", "ctypes_through_a_library",
                 "proc_self_mem", "proc_mem_by_dir_fd", "symlink_to_mem", "harness_proc_mem"):
        assert res[name] == "refused", (name, res)
    assert res["namedtuple"] == "allowed" and res["write_elsewhere"] == "allowed"
    # PyTorch's NVML device count, reached from the solution's first launch on a GPU, is allowed;
    # the same function name in the solution's own file is not
    assert res["torch_nvml_count"] == "allowed" and res["nvml_name_spoofed"] == "refused"
    # ... nor a forged file name, forged code, or the real function with a poisoned ctypes module
    for name in ("nvml_file_forged", "nvml_code_replaced", "nvml_ctypes_poisoned", "gc_file_forged",
                 "getframe_as_collections", "marshal_forged", "compile_laundered", "nvml_globals_forged",
                 "nvml_import_poisoned"):
        assert res[name] == "refused", (name, res)
    assert res["proc_self_status"] == "allowed"
    assert res["recorded"] == ["ctypes", "harness_tampering", "host_compute", "introspection", "process_control"]
    assert not (protected / "x.py").exists()


# ------------------------------------------------------------------------------- the parent's channel
def _frame(obj) -> bytes:
    import pickle
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def test_channel_loads_answers_but_refuses_code(tmp_path):
    """The parent decodes a worker's frames with an allow-list: plain data and tensors load; a
    global outside the list (``builtins.eval``, ``os.system``) is refused before it is called."""
    import pickle

    from d2kbench.sandbox import channel

    reply = {"kind": "outputs", "outputs": [None], "wall_s": 0.5, "types": ["torch.Tensor"], "n": (1, 2.5, "x"),
             "dtype": torch.bfloat16, "size": torch.Size([2, 3]), "device": torch.device("cpu"), "c": complex(1, 2),
             "np": [__import__("numpy").float32(0.5), __import__("numpy").int64(7)]}
    assert channel.loads(_frame(reply), str(tmp_path)) == reply
    marker = tmp_path / "pwned"
    evil = b"cbuiltins\neval\n(V__import__('pathlib').Path(" + repr(str(marker)).encode() + b").touch()\ntR."
    assert pickle.loads(evil) is None and marker.exists()  # what a plain loads does
    marker.unlink()
    with pytest.raises(channel.UntrustedPickle, match="builtins.eval"):
        channel.loads(evil, str(tmp_path))
    with pytest.raises(channel.UntrustedPickle, match="os.system|posix.system"):
        channel.loads(_frame(os.system), str(tmp_path))
    with pytest.raises(channel.UntrustedPickle, match="_reconstruct|_frombuffer"):  # NumPy arrays: refused
        channel.loads(_frame(__import__("numpy").zeros(3)), str(tmp_path))
    assert not marker.exists()


def test_channel_checks_shared_tensors_and_their_descriptors(tmp_path):
    """A CPU tensor crosses as a descriptor fetched from the sender's listener: it loads when the
    listener is in the worker's folder, and is refused from a listener elsewhere; a storage that
    claims more bytes than its descriptor holds (SIGBUS in the parent) is refused."""
    import multiprocessing.resource_sharer as rs
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401 - registers the tensor reductions

    from d2kbench.sandbox import channel

    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    data = bytes(ForkingPickler.dumps(t))
    listener = rs._resource_sharer._address
    out = channel.loads(data, os.path.dirname(listener))
    assert torch.equal(out, t) and type(out) is torch.Tensor
    with pytest.raises(channel.UntrustedPickle, match="not by a listener in the worker's folder"):
        channel.loads(bytes(ForkingPickler.dumps(t)), str(tmp_path))

    fd = os.memfd_create("short")
    os.ftruncate(fd, 16)
    with pytest.raises(channel.UntrustedPickle, match="comes with a descriptor of 16 bytes"):
        channel._rebuild_storage_fd(torch.UntypedStorage, CheckedDupFd(fd), 4096)


def test_resource_sharer_serves_workers_while_another_client_stalls():
    """A client that connects to the parent's listener and sends nothing (a stalling solution, or
    a worker starved of CPU) must not hold back another worker's fetch: each request is served in
    its own thread (before, the listener served one client at a time and the others waited up to
    its 10 s timeout). Fresh interpreter: the listener is a process-wide singleton."""
    code = textwrap.dedent('''
        import os, subprocess, sys, time
        import multiprocessing.resource_sharer as rs
        from multiprocessing.reduction import ForkingPickler
        import torch, torch.multiprocessing
        from d2kbench.sandbox import channel
        channel.harden_resource_sharer()
        t = torch.arange(12, dtype=torch.float32)
        data = bytes(ForkingPickler.dumps(t))
        # another process (the listener serves its own process's stop request inline) connects and sends nothing
        stall = subprocess.Popen([sys.executable, "-c", "import socket, sys, time; s = socket.socket(socket.AF_UNIX); "
                                  "s.connect(sys.argv[1]); print('connected', flush=True); time.sleep(30)",
                                  rs._resource_sharer._address], stdout=subprocess.PIPE, text=True)
        assert stall.stdout.readline().strip() == "connected"
        time.sleep(0.3)
        t0 = time.monotonic()
        out = channel.loads(data, os.path.dirname(rs._resource_sharer._address))
        print("fetched", bool(torch.equal(out, t)), round(time.monotonic() - t0, 2), flush=True)
        stall.kill()
    ''')
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    _, ok, seconds = p.stdout.split()
    assert ok == "True" and float(seconds) < 3.0, p.stdout


class CheckedDupFd:
    """Stands in for a frame's checked descriptor (already received)."""

    def __init__(self, fd):
        self.fd = fd

    def detach(self):
        return self.fd


def test_seccomp_program_forbids_processes_but_not_threads():
    """A child with the CPU worker's filter: threads, Triton's interpreter and PyTorch work;
    fork, subprocess and exec kill it with SIGSYS (which the parent sees from outside)."""
    import signal

    code = textwrap.dedent('''
        import sys, threading
        from d2kbench.sandbox.seccomp import forbid_new_processes
        assert forbid_new_processes() == ""
        t = threading.Thread(target=print, args=("thread",)); t.start(); t.join()
        import torch
        print("torch", int(torch.ones(64, 64).sum()), flush=True)
        import os
        args = {"fork": [], "execv": ["/bin/true", ["true"]], "posix_spawn": ["/bin/true", ["true"], {}]}
        getattr(os, sys.argv[1])(*args[sys.argv[1]])
        print("NOT STOPPED", flush=True)
    ''')
    for how in ("fork", "execv", "posix_spawn"):
        p = subprocess.run([sys.executable, "-c", code, how], capture_output=True, text=True, timeout=120)
        assert p.returncode == -signal.SIGSYS, (how, p.returncode, p.stdout, p.stderr[-500:])
        assert "thread" in p.stdout and "torch 4096" in p.stdout and "NOT STOPPED" not in p.stdout


# ------------------------------------------------------------------------------- launch counter
def test_launch_counter_counts_interpreted_launches(tmp_path):
    script = textwrap.dedent('''
        import os, sys
        os.environ["TRITON_INTERPRET"] = "1"
        import torch, triton, triton.language as tl
        from d2kbench.integrity.launches import Launches
        counter = Launches()
        @triton.jit
        def _copy(a, o, n, B: tl.constexpr):
            i = tl.arange(0, B)
            tl.store(o + i, tl.load(a + i, mask=i < n), mask=i < n)
        a = torch.arange(8.0); o = torch.empty(8)
        _copy[(1,)](a, o, 8, B=8); _copy[(1,)](a, o, 8, B=8)
        print(dict(counter.take()), bool((o == a).all()))
        _copy[lambda meta: (2, 1)](a, o, 8, B=4)
        print(dict(counter.take()), dict(Launches.names(counter.take())))
    ''')
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[-2] == "{('_copy', (1, 1, 1)): 2} True"
    assert lines[-1] == "{('_copy', (2, 1, 1)): 1} {}"  # a grid function is recorded with its value


# ------------------------------------------------------------------------------- bookkeeping
def test_every_catalogue_entry_is_answered():
    """Each of the 47 catalogue entries has a rule, an evil solution, a test, or a documented
    reason in docs/integrity.md why the design makes it impossible."""
    by_rules = {c for r in RULES.values() for c in r.catalogue}
    by_evil = {c for case in _all_cases() for c in case.expect["catalogue"]}
    text = DOCS.read_text()
    documented = {int(m) for m in re.findall(r"^\| (\d+) \|", text, flags=re.M)}
    assert documented == set(range(1, 48)), sorted(set(range(1, 48)) - documented)
    # by construction (8, 12, 17, 27) or by the sandbox and agent tests (36, 44): see the docs
    assert set(range(1, 48)) - by_rules - by_evil <= {8, 12, 17, 27, 36, 44}


def _all_cases():
    """Every evil case: those of the GPU run and the CPU-only ones."""
    cases = {c.path: c for c in discover(EVIL_DIR, "cuda") + discover(EVIL_DIR, "cpu")}
    return list(cases.values())


def test_evil_files_are_well_formed():
    cases = _all_cases()
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


def test_expected_values_of_a_state_update_applied_several_times():
    """A CUDA-graph replay runs input set 0 once per pass over the sets: an in-place state
    update (here a residual add) is applied that often, and the graph check expects the
    reference's state after as many calls, not after one."""
    from d2kbench.checking.expected import Expected
    from d2kbench.checking.inputs import clone_args, make_args
    from d2kbench.tasks import load_task

    task = load_task("fused_add_rmsnorm_fp8_quant")
    ref = task.reference_module()
    wl = task.spec.smoke_workloads[0]
    pristine = make_args(ref, task.spec, wl, 3, "cpu")
    once = Expected(task, ref, wl, pristine).reference()[1]
    thrice = Expected(task, ref, wl, pristine, repeats=3).reference()[1]
    by_hand = clone_args(pristine)
    for _ in range(3):
        ref.run(*by_hand)
    names = [a.name for a in task.spec.args]
    i = next(k for k, a in enumerate(task.spec.args) if getattr(a, "mutable", False))
    assert torch.equal(thrice[i], by_hand[i]) and not torch.equal(thrice[i], once[i]), names[i]


# ------------------------------------------------------------------------------- NVML through the hook
#: A stand-in for the NVIDIA driver's NVML: the four functions PyTorch's device count and UUID
#: queries call (one device), plus one that PyTorch never calls.
FAKE_NVML = textwrap.dedent('''
    #include <string.h>
    int nvmlInit(void) { return 0; }
    int nvmlDeviceGetCount_v2(int *n) { *n = 1; return 0; }
    int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) { *h = (void *)0x1; return 0; }
    int nvmlDeviceGetUUID(void *h, char *buf, unsigned len) { strncpy(buf, "GPU-fake", len); return 0; }
    int nvmlDeviceGetMemoryInfo(void *h, void *info) { return 0; }
''')

NVML_SCRIPT = textwrap.dedent('''
    import json, sys
    import torch.cuda
    from d2kbench.integrity import audit
    sol = sys.argv[1]
    rec = audit.install(sol, [])
    rec.arm()
    results = {}
    for name, src in [
        ("count", "import torch.cuda\\nout.append(torch.cuda._raw_device_count_nvml())"),
        ("uuids", "import torch.cuda\\nout.append(torch.cuda._raw_device_uuid_nvml())"),
        ("other_symbol", "import torch.cuda, ctypes\\nctypes.CDLL('libnvidia-ml.so.1').nvmlDeviceGetMemoryInfo"),
    ]:
        out = []
        try:
            exec(compile(src, sol, "exec"), {"__name__": "sol", "out": out})
            results[name] = ["allowed", out[0] if out else None]
        except PermissionError:
            results[name] = ["refused", None]
    rec.disarm()
    results["recorded"] = sorted({e for _, e in rec.drain()})
    print(json.dumps(results))
''')


def test_pytorch_nvml_queries_run_under_the_hook(tmp_path):
    """PyTorch's NVML device count and UUID queries (reached by a solution's first launch on a GPU
    before CUDA's Python-side initialisation) run to the end under the armed hook: library
    loaded, symbols looked up, foreign functions called, against a stand-in NVML built here. The
    solution loading the same library itself is refused."""
    import shutil

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stand-in NVML")
    (tmp_path / "nvml.c").write_text(FAKE_NVML)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / "libnvidia-ml.so.1"), str(tmp_path / "nvml.c")],
                   check=True, capture_output=True, timeout=120)
    sol = tmp_path / "solution.py"
    sol.write_text("")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"),
           "LD_LIBRARY_PATH": f"{tmp_path}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    out = subprocess.run([sys.executable, "-c", NVML_SCRIPT, str(sol)], capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["count"] == ["allowed", 1]
    assert res["uuids"] == ["allowed", ["GPU-fake"]]
    assert res["other_symbol"][0] == "refused"
    assert res["recorded"] == ["ctypes.dlopen ('libnvidia-ml.so.1',) from solution.py:2"]  # loading it itself
