"""Expected values of correctness calls: drawn once in the trusted parent, shared by every
solution checked on the same inputs.

:func:`draw_call` makes one call's secret inputs; :class:`Expected` computes (lazily, once)
the reference's outputs and argument states on a private copy, and FP64-oracle outputs on
secretly sampled slices; :class:`Prefetch` prepares the first calls while the workers start.
Nothing here ever reaches a worker.
"""

from __future__ import annotations

import time

import torch

from d2kbench.checking.inputs import args_nbytes, clone_args, make_args, secret_seed
from d2kbench.phases import phase
from d2kbench.tasks.loader import Task
from d2kbench.tasks.schema import TensorArg, Workload


def _as_list(result) -> list:
    return list(result) if isinstance(result, (tuple, list)) else [result]


class Expected:
    """Expected values of one call, computed lazily once and shared by every solution checked
    on this call's inputs: the reference's outputs and argument states, and FP64-oracle outputs
    on secretly sampled slices.

    ``oracle_cap`` limits the slices sampled per tolerance (the integrity protocol's extra calls
    use 1: they look for outputs that stopped following the inputs, which the full-tensor
    reference comparison and one FP64 slice show; the tolerance's own count applies to the
    correctness calls)."""

    def __init__(self, task: Task, reference, workload: Workload, pristine: list, oracle_cap: int | None = None,
                 repeats: int = 1):
        self.spec = task.spec
        self.ref = reference
        self.wl = workload
        self.pristine = pristine
        self.oracle_cap = oracle_cap
        self.repeats = repeats  # the reference runs this many times on the same arguments (state updates)
        self._reference: tuple[list, list] | None = None
        self.reference_s: float | None = None  # seconds the reference took (the default timeouts scale with it)
        self._oracle: dict = {}

    def reference(self) -> tuple[list, list]:
        """(reference outputs, argument states after the reference ran), on a private copy."""
        if self._reference is None:
            with phase("reference"), torch.no_grad():
                ref_args = clone_args(self.pristine)
                t0 = time.perf_counter()
                for _ in range(self.repeats - 1):
                    self.ref.run(*ref_args)
                self._reference = (_as_list(self.ref.run(*ref_args)), ref_args)
                settle(ref_args)
                self.reference_s = time.perf_counter() - t0
        return self._reference

    def oracle(self, tol) -> tuple[tuple[str, torch.Tensor] | None, list]:
        """(sample, oracle outputs on the sampled slices) for a tolerance's sampling rule."""
        key = (tol.sample.axis, tol.sample.count) if tol.sample else None
        if key not in self._oracle:
            fn = getattr(self.ref, "oracle", None)
            if fn is None:
                raise ValueError(f"task {self.spec.id!r} asks for an oracle but reference.py defines none")
            sample, args = None, self.pristine
            if tol.sample:
                size = self.wl.axes[tol.sample.axis]
                count = min(tol.sample.count, self.oracle_cap or tol.sample.count)
                gen = torch.Generator().manual_seed(secret_seed())
                sample = (tol.sample.axis, torch.randperm(size, generator=gen)[:count].sort().values)
                args = [take_slice(a, spec, *sample) for a, spec in zip(args, self.spec.args)]
            with phase("oracle"), torch.no_grad():
                self._oracle[key] = (sample, _as_list(fn(*clone_args(args))))
                settle(args)
        return self._oracle[key]

    def precompute(self) -> None:
        """Compute now everything the checks of this call will ask for: the reference's outputs
        and states, and the FP64-oracle slices of every ``against: oracle`` tolerance."""
        self.reference()
        for ospec in self.spec.outputs:
            for tol in self.wl.checks_for(ospec.name, ospec.checks):
                if tol.against == "oracle":
                    self.oracle(tol)

    def nbytes(self) -> int:
        """Bytes held: the inputs plus the expected values computed so far."""
        held = list(self.pristine)
        if self._reference is not None:
            held += self._reference[0] + self._reference[1]
        for _sample, outs in self._oracle.values():
            held += outs
        return args_nbytes(held)


def draw_call(task: Task, reference, workload: Workload, device: str) -> tuple[list, Expected]:
    """Fresh secret inputs for one correctness call and their (lazy) expected values."""
    with phase("inputs"):
        pristine = make_args(reference, task.spec, workload, secret_seed(), device)
        settle(pristine)
    return pristine, Expected(task, reference, workload, pristine)


class Prefetch:
    """Correctness calls drawn and checked-against ahead of time, while the workers start.

    Spawned workers spend seconds importing torch, initialising CUDA and importing (and
    guarding) the solution, during which the parent and the GPU are idle. :meth:`step` draws the
    next correctness call's secret inputs and computes its expected values (reference, FP64
    oracle) in that time; :func:`d2kbench.harness.workload.run_workload` takes them instead of drawing new ones. The
    inputs stay secret in the parent until their call; each solution still gets its own copy
    at a fresh address. What is prefetched is bounded by ``budget_bytes`` of inputs plus
    expected values.
    """

    def __init__(self, task: Task, reference, workloads: list[Workload], device: str, calls: int,
                 budget_bytes: int):
        self.task, self.reference, self.device = task, reference, device
        self.plan = [wl for wl in workloads for _ in range(calls)]
        self.ready: dict[str, list[tuple[list, Expected]]] = {}
        self.budget_bytes = budget_bytes
        self.held_bytes = 0
        self.done = not self.plan

    def step(self) -> bool:
        """Prepare the next planned call; False when there is nothing (more) to do: the plan is
        finished, the budget is spent, or preparing failed (the same failure then surfaces
        where the call is drawn normally)."""
        if self.done:
            return False
        wl = self.plan.pop(0)
        try:
            pristine, expected = draw_call(self.task, self.reference, wl, self.device)
            expected.precompute()
        except Exception:  # noqa: BLE001 - e.g. OOM: stop prefetching, the normal path reports
            self.done = True
            return False
        self.ready.setdefault(wl.id, []).append((pristine, expected))
        self.held_bytes += expected.nbytes()
        self.done = not self.plan or self.held_bytes >= self.budget_bytes
        return True

    def take(self, workload: Workload) -> tuple[list, Expected] | None:
        """The oldest prepared call of ``workload`` (removed), or None."""
        queue = self.ready.get(workload.id)
        if not queue:
            return None
        item = queue.pop(0)
        self.held_bytes -= item[1].nbytes()
        return item


def prefetch_budget(device: str) -> int:
    """Bytes the parent may hold in prefetched calls: a quarter of the GPU memory free at the
    start (the workers need the rest), 1 GiB on the CPU."""
    if device == "cuda":
        free, _total = torch.cuda.mem_get_info()
        return free // 4
    return 1 << 30


def settle(args: list) -> None:
    """Wait for the GPU work queued so far when ``args`` live on a GPU, so that the phase
    clock charges asynchronous kernels to the phase that queued them (the parent would wait
    for them at its next check anyway)."""
    if any(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
        torch.cuda.synchronize()


def take_slice(value, spec, axis: str, idx: torch.Tensor):
    if isinstance(spec, TensorArg) and axis in spec.shape:
        return value.index_select(spec.shape.index(axis), idx.to(value.device))
    return value
