"""Alternative ``torch_compile_exact_casts``: ``torch.compile`` of the reference with inductor's
``emulate_precision_casts`` on.

What a user would try before writing a kernel: inductor fuses the rank-order sum of the
partials, the residual add, the RMSNorm and the quantiser into one generated kernel. By
default inductor keeps a value it rounds to bf16 in FP32 inside a fused kernel (it would
normalise the unrounded residual, as fused_add_rmsnorm_fp8_quant's alternative records), so
the precision casts are emulated to keep the task's roundings. Compiled once per shape
(``dynamic=False``) on the first call, part of the warm-up the timers exclude. Declared for
CUDA only: on the CPU inductor's C++ compilation would dominate ``d2k validate``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import torch

from d2kbench.harness.compiled_reference import RECOMPILE_LIMIT
from d2kbench.harness.worker import REFERENCE_MODULE
from d2kbench.tasks.loader import import_file

_compiled: Callable | None = None


def run(partials: list[torch.Tensor], residual: torch.Tensor, weight: torch.Tensor, eps: float, group_size: int,
        quant: int):
    """The task reference's ``run`` compiled with exact precision casts: same arguments and results
    as ``reference.run`` (updates ``residual`` in place, returns ``(y, y_s)``). Inside a d2k worker
    it compiles the reference the worker imported; elsewhere the task folder's ``reference.py``.
    """
    global _compiled
    if _compiled is None:
        module = sys.modules.get(REFERENCE_MODULE)
        if module is None:
            module = import_file(Path(__file__).resolve().parents[1] / "reference.py", "allreduce_rmsnorm_reference")
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        _compiled = torch.compile(module.run, dynamic=False, options={"emulate_precision_casts": True})
    return _compiled(partials, residual, weight, eps, group_size, quant)
