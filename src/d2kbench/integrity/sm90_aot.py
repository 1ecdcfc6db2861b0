"""Ahead-of-time compilation of Triton kernels for the H200 (sm_90) on a machine without a GPU.

The CPU interpreter (``TRITON_INTERPRET=1``) accepts code the real compiler rejects and never
shows what the GPU compiler makes of a kernel (shared-memory layouts, pipelining, registers).
Triton's NVIDIA back end compiles without a GPU once the active driver names the target: the
stand-in driver here answers ``cuda:90`` (warp size 32), and :func:`record_launches` turns every
``kernel[grid](...)`` launch into a compile-only call (front end, TTGIR, LLVM, PTX and
``ptxas`` to a cubin, what the H200 would compile) that launches nothing.

Used by ``devtools/compile_sm90.py`` (resources of every launched kernel),
``devtools/latency_skeletons.py`` and the tests that compile for sm_90 in a child process
(``tests/test_triton_lint.py``, ``tests/test_task_chunked_prefill_paged.py``).

Importing this module changes nothing (it does not even import Triton); the changes are made by
:func:`install_sm90_driver` and :func:`record_launches`, for the rest of the process. Call them
in a process of their own: the active driver and ``JITFunction.run`` are global, and kernels
defined while ``TRITON_INTERPRET=1`` was set stay interpreted.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

# Imports inside functions: importing this module changes nothing and loads no Triton; Triton is
# imported by the functions that install the stand-ins (after TRITON_INTERPRET is removed).

#: (backend, compute capability, warp size) of the H200.
SM90 = ("cuda", 90, 32)


class _CompileOnlyBench:
    """Stand-in benchmarker (``triton.testing.do_bench``'s signature): runs the call once (which
    compiles under :func:`record_launches`) and reports a dummy time, so that an autotuner
    compiles every config that survives its pruning."""

    def __call__(self, fn: Callable[[], Any], quantiles: Any = None, **_: Any) -> float | list[float]:
        fn()
        return [1.0, 1.0, 1.0] if quantiles else 1.0


class Sm90Driver:
    """Just enough of Triton's active driver (``triton.runtime.driver.active``) for ahead-of-time
    compilation for sm_90: target, device 0, stream 0, CPU tensors, the stand-in benchmarker."""

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget(*SM90)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")

    def get_benchmarker(self) -> _CompileOnlyBench:
        return _CompileOnlyBench()

    def get_device_interface(self):
        import torch

        return torch.cuda

    def map_python_to_cpp_type(self, ty: str) -> str:
        return ty


def install_sm90_driver() -> Sm90Driver:
    """Make :class:`Sm90Driver` Triton's active driver, with the interpreter off.

    Removes ``TRITON_INTERPRET`` from the environment (Triton reads it when a ``@triton.jit``
    function is defined, its own standard library's included, and when one is launched), so
    call this before anything imports Triton (torch alone does not) and before importing the
    modules whose kernels are to be compiled. Returns the installed driver.

    Raises:
        RuntimeError: Triton was imported with the interpreter on (its standard library's
            kernels are interpreted: the NVIDIA back end would fail on them).
        ImportError: Triton or its NVIDIA back end is not installed.
    """
    interpreted = "triton" in sys.modules and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    os.environ.pop("TRITON_INTERPRET", None)
    import triton.backends.nvidia  # noqa: F401 - the back end that compiles for cuda:90
    import triton.language.standard as standard
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    if interpreted or not isinstance(standard.cdiv, JITFunction):
        raise RuntimeError("Triton was imported with TRITON_INTERPRET=1: install the sm_90 driver before "
                           "anything imports triton")
    drv = Sm90Driver()
    driver.set_active(drv)
    return drv


def record_launches(launches: list[dict]) -> Callable[[], None]:
    """Make every Triton launch compile for the active target and launch nothing; returns a
    function that undoes the change.

    Each launch appends one record to ``launches``: ``kernel`` (the function's name), ``grid``
    (a tuple of ints, the text of the error the grid function raised, or None), ``consts`` (the
    constexpr arguments by name), ``options`` (``num_warps``/``num_stages`` where the launch
    passed them) and either ``compiled`` (Triton's ``CompiledKernel``: ``asm["ttgir"]``,
    ``asm["ptx"]``, ``asm["cubin"]``, ``metadata``) or ``error`` (``"Type: message"`` of the
    compile error). The launch itself returns None.
    """
    from triton.runtime.jit import JITFunction

    original = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        named = dict(zip(self.arg_names, args)) | kwargs
        rec: dict = {"kernel": self.fn.__name__, "grid": None,
                     "consts": {p.name: named.get(p.name) for p in self.params if p.is_constexpr},
                     "options": {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs}}
        try:
            g = grid(named) if callable(grid) else grid
            rec["grid"] = tuple(int(x) for x in g) if g is not None else None
        except Exception as e:  # noqa: BLE001 - reported with the launch, not raised
            rec["grid"] = f"grid error {e}"
        try:
            rec["compiled"] = original(self, *args, grid=grid, warmup=True, **kwargs)
        except Exception as e:  # noqa: BLE001
            rec["error"] = f"{type(e).__name__}: {e}"
        launches.append(rec)
        return None

    JITFunction.run = compile_only

    def undo() -> None:
        JITFunction.run = original

    return undo
