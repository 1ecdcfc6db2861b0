"""Static (AST) integrity rules: each rule fires on the spellings it targets, Triton code is
exempt, helpers next to the solution are reviewed too, and no shipped solution is flagged."""

from __future__ import annotations

import pytest

from d2kbench.integrity.rules import RULES
from d2kbench.integrity.static import static_violations
from d2kbench.tasks import list_tasks, load_task

CASES = [
    ("import torch\ndef run(a):\n    return a @ a\n", "ast_forbidden_call"),
    ("import torch\ndef run(a):\n    a @= a\n    return a\n", "ast_forbidden_call"),
    ("from torch import matmul as mm\ndef run(a):\n    return mm(a, a)\n", "ast_forbidden_call"),
    ("import torch.nn.functional as F\ndef run(a):\n    return F.linear(a, a)\n", "ast_forbidden_call"),
    ("import torch\ndef run(q):\n    return torch.nn.functional.scaled_dot_product_attention(q, q, q)\n", "ast_forbidden_call"),
    ("import torch\ndef run(a):\n    return getattr(torch, 'einsum')('ij,jk', a, a)\n", "ast_forbidden_call"),
    ("import torch\ndef run(a):\n    return torch.ops.aten.mm(a, a)\n", "ast_forbidden_call"),
    ("import torch\ndef run(a):\n    return a.bmm(a)\n", "ast_forbidden_call"),
    ("import torch\ndef run(a):\n    return torch.linalg.svd(a)\n", "ast_forbidden_call"),
    ("import torch\ndef run(a):\n    return torch.compile(lambda x: x)(a)\n", "ast_compile"),
    ("from torch.utils.cpp_extension import load_inline\n", "ast_forbidden_import"),
    ("from torch.utils import cpp_extension\n", "ast_forbidden_import"),
    ("import ctypes\n", "ast_forbidden_import"),
    ("import cupy as cp\n", "ast_forbidden_import"),
    ("from cuda import cudart\n", "ast_forbidden_import"),
    ("import threading\n", "ast_forbidden_import"),
    ("from concurrent.futures import ThreadPoolExecutor\n", "ast_forbidden_import"),
    ("import d2kbench.harness.timing\n", "ast_forbidden_import"),
    ("import gc\n", "ast_forbidden_import"),
    ("import torch\ndef run(a):\n    try:\n        return k(a)\n    except Exception:\n        return torch.matmul(a, a)\n",
     "ast_try_fallback"),
    ("import torch\ndef run(a):\n    try:\n        return k(a)\n    except RuntimeError:\n        return a.softmax(-1).sum()\n",
     "ast_try_fallback"),
    ("import sys\ndef run(a):\n    return sys._getframe(1).f_locals\n", "ast_introspection"),
    ("import sys\nref = sys.modules['d2k_task_reference']\n", "ast_introspection"),
    ("import torch\nwith torch._C._DisableTorchDispatch():\n    pass\n", "ast_introspection"),
    ("def f():\n    pass\ng = f.__code__\n", "ast_introspection"),
    ("import time\ntime.perf_counter = lambda: 0.0\n", "ast_monkeypatch"),
    ("import torch\ntorch.cuda.Event.elapsed_time = lambda s, e: 0.0\n", "ast_monkeypatch"),
    ("import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n", "ast_monkeypatch"),
    ("import torch\nsetattr(torch.cuda, 'synchronize', print)\n", "ast_monkeypatch"),
    ("import torch\nclass T(torch.Tensor):\n    pass\n", "ast_tensor_subclass"),
    ("class P:\n    def __torch_function__(self, *a):\n        pass\n", "ast_tensor_subclass"),
    ("import torch\ndef run(a):\n    return a.as_subclass(object)\n", "ast_tensor_subclass"),
    ("import torch\ndef run(a):\n    return torch.cuda.is_current_stream_capturing()\n", "ast_capture_aware"),
    ("import torch\ng = torch.cuda.CUDAGraph()\n", "ast_capture_aware"),
    ("ATTR = 'cudaStreamAttributeAccessPolicyWindow'\n", "ast_l2_persistence"),
    ("def run(a):\n    return a.cudaLimitPersistingL2CacheSize\n", "ast_l2_persistence"),
    ("exec('x = 1')\n", "ast_dynamic_code"),
    ("m = __import__('torch')\n", "ast_dynamic_code"),
    ("import torch\ndef run(name):\n    return getattr(torch, name)\n", "ast_dynamic_code"),
    ("import os\ndef run(a):\n    os._exit(0)\n", "ast_process_control"),
    ("import sys\ndef run(a):\n    sys.exit(0)\n", "ast_process_control"),
    ("import os\ndef run(a):\n    os.kill(os.getppid(), 9)\n", "ast_process_control"),
    ("import reference\n", "ast_reference_import"),
    ("import numpy as np\n", "ast_host_compute"),
    ("def run(a):\n    return a.numpy().sum()\n", "ast_host_compute"),
    ("def run(a):\n    return sum(a.tolist())\n", "ast_host_compute"),
    ("import torch\ndef run(a):\n    return torch.from_numpy(a)\n", "ast_host_compute"),
    ("def run(a):\n    return a.to('cpu')\n", "ast_host_compute"),
    ("def run(a):\n    return a.cpu()\n", "ast_host_compute"),
    ("import _posixsubprocess\n", "ast_forbidden_import"),
    ("import sqlite3\n", "ast_forbidden_import"),
]


@pytest.mark.parametrize("source, rule", CASES)
def test_rule_fires(tmp_path, source, rule):
    path = tmp_path / "solution.py"
    path.write_text(source)
    found = static_violations(path)
    assert rule in {v.rule for v in found}, found
    assert all(v.rule in RULES for v in found)
    hit = [v for v in found if v.rule == rule][0]
    assert hit.evidence.startswith("solution.py:")  # file:line: source


CLEAN = '''
"""An ordinary Triton solution: nothing here may be flagged."""
import functools
import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:
    TensorDescriptor = None

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class Config:
    block: int = 64


@triton.jit
def _kernel(a_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    a = tl.load(a_ptr + offs, mask=offs < n, other=0.0)
    b = tl.dot(a[:, None] * 1.0, a[None, :]) if BLOCK > 0 else a
    c = a @ a  # Triton code may use @
    tl.store(o_ptr + offs, a, mask=offs < n)


@functools.lru_cache(maxsize=8)
def schedule(n: int, device: str) -> torch.Tensor:
    return torch.tensor([i for i in range(n)], dtype=torch.int32, device=device)


def run(G, steps=5):
    if steps != 5:
        raise ValueError("steps must be 5")
    out = torch.empty_like(G)
    v = G.mT.contiguous().view(-1)
    _kernel[(triton.cdiv(v.numel(), 64),)](v, out, v.numel(), BLOCK=64)
    torch.cuda.synchronize() if G.is_cuda else None
    return out.reshape(G.shape)
'''


def test_ordinary_solution_is_clean(tmp_path):
    path = tmp_path / "solution.py"
    path.write_text(CLEAN)
    assert static_violations(path) == []


def test_helper_modules_next_to_the_solution_are_reviewed(tmp_path):
    (tmp_path / "helper.py").write_text("import ctypes\n")
    (tmp_path / "solution.py").write_text("import helper\ndef run(a):\n    return a\n")
    found = static_violations(tmp_path / "solution.py")
    assert [v.rule for v in found] == ["ast_forbidden_import"]
    assert found[0].evidence.startswith("helper.py:1:")


def test_task_forbidden_modules(tmp_path):
    (tmp_path / "solution.py").write_text("import scipy.linalg\n")
    assert static_violations(tmp_path / "solution.py") == []
    assert [v.rule for v in static_violations(tmp_path / "solution.py", ["scipy"])] == ["ast_forbidden_import"]


def test_unparsable_file_is_left_to_the_worker(tmp_path):
    (tmp_path / "solution.py").write_text("def run(:\n")
    assert static_violations(tmp_path / "solution.py") == []


@pytest.mark.parametrize("task_id", list_tasks())
def test_shipped_solutions_are_statically_clean(task_id):
    """Zero false positives of the static rules: every shipped solution except the (trusted)
    reference passes."""
    task = load_task(task_id)
    for name, path in task.solutions().items():
        if name == "reference":
            continue
        assert static_violations(path, task.spec.forbidden.modules) == [], f"{task_id}/{name}"
