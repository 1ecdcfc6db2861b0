"""The Triton portability lint (d2kbench.integrity.triton_lint): what the CPU interpreter accepts
in ``@triton.jit`` code but the GPU compiler rejects.

* every shipped solution and template (all tasks) and every evil helper passes;
* a module with a plain-float global (the per_token_group_quant_fp8 expert's first H200 failure),
  an annotated-but-not-constexpr global, Python builtins the compiler does not know, a torch call
  and a non-jit helper is flagged; ``tl.constexpr`` globals, ``tl`` dtypes, jit helpers and the
  compiler's own builtins pass;
* ``d2k lint`` reports the findings;
* the verdicts agree with triton's real sm_90 compiler (ahead-of-time, no GPU needed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

import d2kbench
from d2kbench.cli import app
from d2kbench.harness.evil import EVIL_DIR
from d2kbench.integrity.triton_lint import check_files, check_module
from d2kbench.tasks.loader import SUITE_DIR, import_file

BAD = textwrap.dedent('''
    import torch
    import triton
    import triton.language as tl

    EPS = 1e-10
    ANNOTATED: tl.constexpr = 448.0
    SIZES = (1, 2)
    TORCH_DTYPE = torch.float16


    def helper(x):
        return x


    @triton.jit
    def k_eps(p, B: tl.constexpr):
        o = tl.arange(0, B)
        tl.store(p + o, tl.maximum(tl.load(p + o), EPS))


    @triton.jit
    def k_annotated(p, B: tl.constexpr):
        o = tl.arange(0, B)
        tl.store(p + o, tl.minimum(tl.load(p + o), ANNOTATED))


    @triton.jit
    def k_tuple(p, B: tl.constexpr):
        o = tl.arange(0, B)
        tl.store(p + o, tl.load(p + o) * SIZES[0])


    @triton.jit
    def k_torch_dtype(p, B: tl.constexpr):
        o = tl.arange(0, B)
        tl.store(p + o, tl.load(p + o).to(TORCH_DTYPE).to(tl.float32))


    @triton.jit
    def k_abs(p, B: tl.constexpr):
        o = tl.arange(0, B)
        tl.store(p + o, abs(tl.load(p + o)))


    @triton.jit
    def k_builtin_tuple(p, B: tl.constexpr):
        o = tl.arange(0, B)
        t = tuple((1, 2))
        tl.store(p + o, tl.load(p + o) * t[0])


    @triton.jit
    def k_torch_call(p, B: tl.constexpr):
        o = tl.arange(0, B)
        tl.store(p + o, torch.exp(tl.load(p + o)))


    @triton.jit
    def k_helper(p, B: tl.constexpr):
        o = tl.arange(0, B)
        tl.store(p + o, helper(tl.load(p + o)))
''')

GOOD = textwrap.dedent('''
    import triton
    import triton.language as tl

    EPS = tl.constexpr(1e-10)
    DT = tl.float16
    NOTHING = None
    x = 3.0          # shadowed by the kernels' parameter / local of the same name


    @triton.jit
    def _helper(x):
        return tl.maximum(x, EPS)


    @triton.autotune(configs=[triton.Config({"B": 16})], key=["n"])
    @triton.jit
    def k_ok(p, n, B: tl.constexpr):
        o = tl.arange(0, B)
        x = tl.load(p + o, mask=o < n, other=0.0).to(DT).to(tl.float32)
        acc = tl.zeros([B], dtype=tl.float32) + float("-inf")
        for i in range(min(B, 4)):
            acc = tl.maximum(acc, x + i)
        for j in tl.static_range(2):
            acc += j
        if NOTHING is None:
            acc = _helper(acc)
        tl.store(p + o, acc, mask=o < n)


    @triton.jit
    def k_shadow(x, B: tl.constexpr):
        o = tl.arange(0, B)
        tl.store(x + o, tl.load(x + o) * EPS)
''')

#: kernel -> (rule, name) the lint must report
EXPECTED_BAD = {
    "k_eps": ("triton_global", "EPS"),
    "k_annotated": ("triton_global", "ANNOTATED"),
    "k_tuple": ("triton_global", "SIZES"),
    "k_torch_dtype": ("triton_global", "TORCH_DTYPE"),
    "k_abs": ("triton_builtin", "abs"),
    "k_builtin_tuple": ("triton_builtin", "tuple"),
    "k_torch_call": ("triton_unsupported_call", "torch.exp"),
    "k_helper": ("triton_global", "helper"),
}


def _module(tmp_path: Path, name: str, text: str):
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    return path, import_file(path)


def test_bad_module_is_flagged(tmp_path):
    _, mod = _module(tmp_path, "bad_kernels", BAD)
    found = {(f.function, f.rule, f.name) for f in check_module(mod)}
    assert found == {(k, *v) for k, v in EXPECTED_BAD.items()}
    eps = next(f for f in check_module(mod) if f.name == "EPS")
    assert "Cannot access global variable EPS" in str(eps) and "tl.constexpr(" in str(eps) and eps.line > 0


def test_constexpr_globals_pass(tmp_path):
    _, mod = _module(tmp_path, "good_kernels", GOOD)
    assert check_module(mod) == []


def test_every_shipped_solution_and_evil_helper_passes():
    files = sorted(SUITE_DIR.glob("*/solutions/*.py")) + sorted(SUITE_DIR.glob("*/template.py")) \
        + sorted(Path(EVIL_DIR).rglob("*.py"))
    assert len(files) > 20
    found = {p: fs for p, fs in check_files(files).items() if fs}
    assert not found, "\n".join(f"{f.rule}: {f}" for fs in found.values() for f in fs)


def test_lint_cli_reports_triton_findings(tmp_path):
    bad = tmp_path / "bad_solution.py"
    bad.write_text(BAD + "\n\ndef run(x):\n    return x\n")
    good = tmp_path / "good_solution.py"
    good.write_text(GOOD + "\n\ndef run(x):\n    return x\n")
    res = CliRunner().invoke(app, ["lint", str(bad), str(good)])
    assert res.exit_code == 1, res.output
    assert "triton_global" in res.output and "EPS" in res.output and "triton_builtin" in res.output
    assert "ok " in res.output  # the good file
    res = CliRunner().invoke(app, ["lint", "--no-triton", str(bad)])
    assert res.exit_code == 0, res.output


def test_lint_reviews_every_file_and_reports_the_unreviewable_ones(tmp_path):
    absent = tmp_path / "absent.py"
    broken = tmp_path / "broken.py"
    broken.write_text("def run(x:\n    return x\n")
    bad = tmp_path / "bad_solution.py"
    bad.write_text(BAD + "\n\ndef run(x):\n    return x\n")
    good = tmp_path / "good_solution.py"
    good.write_text(GOOD + "\n\ndef run(x):\n    return x\n")
    res = CliRunner().invoke(app, ["lint", str(absent), str(broken), str(bad), str(good)], env={"COLUMNS": "250"})
    assert res.exit_code == 1, res.output
    lines = res.output.splitlines()
    assert lines.index(f"FAIL {absent}") < lines.index(f"FAIL {broken}") < lines.index(f"FAIL {bad}") \
        < lines.index(f"ok {good}")
    assert f"  unreadable: {absent}: No such file or directory" in lines
    assert any(line.startswith(f"  syntax_error: {broken}:1: SyntaxError") for line in lines)
    assert "triton_global" in res.output and "EPS" in res.output  # the file after the broken one
    res = CliRunner().invoke(app, ["lint", "--no-triton", str(broken)])
    assert res.exit_code == 1 and "syntax_error" in res.output and "ok" not in res.output.split()


#: The folder that holds the d2kbench package under test (the child process imports it from there).
SRC = str(Path(d2kbench.__file__).resolve().parents[1])

_COMPILE = textwrap.dedent('''
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from d2kbench.integrity.sm90_aot import install_sm90_driver
    install_sm90_driver()  # before the kernels are defined: the interpreter off, target cuda:90
    import torch, triton
    sys.path.insert(0, sys.argv[2])
    mod = __import__(sys.argv[3])
    out, x = {}, torch.empty(64)
    for name in sys.argv[4:]:
        k = getattr(mod, name)
        k = getattr(k, "fn", k) if not isinstance(k, triton.runtime.jit.JITFunction) else k
        try:
            k.warmup(x, B=16, grid=(1,)) if "n" not in k.arg_names else k.warmup(x, 64, B=16, grid=(1,))
            out[name] = "ok"
        except Exception as e:
            out[name] = f"{type(e).__name__}: {e}"[-3000:]
    print("RESULT " + json.dumps(out))
''')


def test_lint_agrees_with_sm90_compiler(tmp_path):
    pytest.importorskip("triton.backends.nvidia")
    (tmp_path / "bad_kernels.py").write_text(BAD)
    (tmp_path / "good_kernels.py").write_text(GOOD)
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "cache")}  # the child turns the interpreter off
    verdicts = {}
    for mod, names in (("bad_kernels", list(EXPECTED_BAD)), ("good_kernels", ["k_ok", "k_shadow"])):
        proc = subprocess.run([sys.executable, "-c", _COMPILE, SRC, str(tmp_path), mod, *names],
                              capture_output=True, text=True, env=env, timeout=300)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        assert line, proc.stderr[-2000:]
        verdicts.update(json.loads(line[-1][len("RESULT "):]))
    assert {k for k, v in verdicts.items() if v != "ok"} == set(EXPECTED_BAD), verdicts
    assert "Cannot access global variable EPS" in verdicts["k_eps"]
    assert "abs is not defined" in verdicts["k_abs"]
