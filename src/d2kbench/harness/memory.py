"""Device memory of one call: the peak a call allocates and what its outputs hold.

A solution's memory matters where the point of a task is *not* materialising something (a
fused linear cross-entropy must never hold the whole logits). After the timing loop the worker
runs one more call through the same wrapper as the timed calls and records, with PyTorch's
caching-allocator statistics (``torch.cuda.memory_allocated`` / ``max_memory_allocated``, bytes
of live tensors, not the allocator's reserved pool):

* ``peak_bytes``: the highest allocation during the call above what was allocated just before
  it (the inputs and whatever the harness holds are excluded; the outputs, workspaces and
  anything the call frees again are included);
* ``output_bytes``: the bytes of the distinct storages of the tensors the call returned.

``peak_bytes - output_bytes`` is the call's extra memory (workspace). Memory a solution keeps
across calls (a cached workspace) is not in the peak of a later call; caching buffers that hold
input-derived values is forbidden anyway, and reusing an output's storage is caught by the
integrity rules (``output_reuse``). The worker reports the figures (tamper-evident only, like
its other self-reports); CPU runs have no allocator statistics and report none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

# Imports inside functions: torch loads in the worker, when a call is measured.


class AllocatorStats(Protocol):
    """What :func:`measure_call` reads: bytes currently allocated, the peak since the last
    reset, and a synchronisation that makes both final."""

    def sync(self) -> None: ...
    def allocated(self) -> int: ...
    def reset_peak(self) -> None: ...
    def peak(self) -> int: ...


class CudaAllocatorStats:
    """:class:`AllocatorStats` of the current CUDA device (PyTorch's caching allocator)."""

    def __init__(self) -> None:
        import torch

        self._cuda = torch.cuda

    def sync(self) -> None:
        self._cuda.synchronize()

    def allocated(self) -> int:
        return int(self._cuda.memory_allocated())

    def reset_peak(self) -> None:
        self._cuda.reset_peak_memory_stats()

    def peak(self) -> int:
        return int(self._cuda.max_memory_allocated())


@dataclass(frozen=True)
class CallMemory:
    """Bytes of one call: peak allocation above the pre-call level, and its outputs' storages."""

    peak_bytes: int
    output_bytes: int

    @property
    def extra_bytes(self) -> int:
        """Peak minus the outputs: the call's workspace (never negative)."""
        return max(0, self.peak_bytes - self.output_bytes)


def output_nbytes(result) -> int:
    """Bytes of the distinct storages of the tensors in ``result`` (one tensor or a tuple/list)."""
    import torch

    outs = list(result) if isinstance(result, (tuple, list)) else [result]
    seen: dict[int, int] = {}
    for o in outs:
        if isinstance(o, torch.Tensor):
            st = o.untyped_storage()
            seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
    return sum(seen.values())


def measure_call(call: Callable[[], object], stats: AllocatorStats) -> tuple[object, CallMemory]:
    """Run ``call()`` once and measure it (module docstring); returns ``(result, CallMemory)``."""
    stats.sync()
    base = stats.allocated()
    stats.reset_peak()
    result = call()
    stats.sync()
    return result, CallMemory(peak_bytes=max(0, stats.peak() - base), output_bytes=output_nbytes(result))
