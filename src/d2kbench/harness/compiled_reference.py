"""The harness-provided alternative ``compile_reference: true``: ``torch.compile`` of the task
reference's ``run`` in the default mode, what a user would try before writing a kernel.

One file serves every task. The worker imports the task's ``reference.py`` under
:data:`d2kbench.harness.worker.REFERENCE_MODULE` before it imports a solution; :func:`run`
compiles that module's ``run`` on its first call (compilation is part of the warm-up, which the
timers exclude) and calls the compiled function from then on. The parent marks this file as
trusted only for tasks that declare a ``compile_reference`` alternative
(:meth:`d2kbench.tasks.loader.Task.is_trusted`).

Each workload stands for a separate deployment shape, so the compiled code is specialised to
every shape (``dynamic=False``: what a user compiling for one shape gets, instead of the
shape-generic code dynamo switches to after a second shape), and the recompile limit is raised
so that a run over many workloads never falls back to eager. The harness's checked calls run
in deterministic mode (a global state dynamo guards on), which adds one compilation per shape.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

from d2kbench.harness.worker import REFERENCE_MODULE

#: Compiled variants kept per function before dynamo falls back to eager (its default is 8).
RECOMPILE_LIMIT = 64

_compiled: Callable | None = None


def compile_reference(fn: Callable) -> Callable:
    """``torch.compile(fn)`` in the default mode, specialised per input shape (compilation, and
    any error it raises, happens on the first call of the returned function)."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    return torch.compile(fn, dynamic=False)


def _reference_run() -> Callable:
    """The ``run`` of the task reference the worker imported.

    Raises:
        RuntimeError: no task reference is imported (this file was imported outside a worker).
    """
    module = sys.modules.get(REFERENCE_MODULE)
    if module is None or not callable(getattr(module, "run", None)):
        raise RuntimeError(f"compiled_reference needs the task reference imported as {REFERENCE_MODULE!r} "
                           "(it runs inside a d2k worker)")
    return module.run


def run(*args):
    """The task reference's ``run`` compiled by ``torch.compile``: same arguments, same results
    (up to the floating-point reordering inductor may do)."""
    global _compiled
    if _compiled is None:
        _compiled = compile_reference(_reference_run())
    return _compiled(*args)
