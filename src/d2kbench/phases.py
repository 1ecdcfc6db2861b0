"""Where the harness's own time goes: exclusive wall time per named phase.

The harness overhead of an evaluation is its wall time minus the time of the timed calls
(:attr:`d2kbench.results.Evaluation.overhead_s`). To show what that overhead is made
of, the trusted parent runs its steps inside :func:`phase` blocks (``inputs``, ``reference``,
``oracle``, ``checks``, ``worker_calls``, ...). Phases nest: time spent in an inner phase counts
for the inner phase only, so the totals add up to the wall time they cover.

A :class:`PhaseClock` is made current with :meth:`PhaseClock.active`; :func:`phase` outside any
active clock does nothing (library callers pay nothing).
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator
from contextvars import ContextVar

_CURRENT: ContextVar[PhaseClock | None] = ContextVar("d2k_phase_clock", default=None)


class PhaseClock:
    """Exclusive wall-clock seconds per phase name (``perf_counter``).

    Attributes:
        totals: ``{phase: seconds}``; a phase's time excludes the phases nested in it.
    """

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self._stack: list[list] = []  # [name, start of the current uninterrupted stretch]

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Count the wall time of the block for ``name`` (pausing the enclosing phase)."""
        now = time.perf_counter()
        if self._stack:
            outer = self._stack[-1]
            self.totals[outer[0]] += now - outer[1]
        self._stack.append([name, now])
        try:
            yield
        finally:
            end = time.perf_counter()
            inner, start = self._stack.pop()
            self.totals[inner] += end - start
            if self._stack:
                self._stack[-1][1] = end

    @contextlib.contextmanager
    def active(self) -> Iterator[PhaseClock]:
        """Make this clock the one :func:`phase` reports to, for the block."""
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)

    def add(self, name: str, seconds: float) -> None:
        """Add time measured elsewhere."""
        self.totals[name] += float(seconds)

    def move(self, source: str, parts: dict[str, float]) -> None:
        """Reassign seconds already counted for ``source`` to finer phases measured elsewhere
        (e.g. the worker's own breakdown of a timing request); negative values are ignored."""
        for name, sec in parts.items():
            if isinstance(sec, (int, float)) and sec >= 0:
                self.totals[source] -= float(sec)
                self.totals[name] += float(sec)

    def snapshot(self) -> dict[str, float]:
        """``{phase: seconds}`` (a copy, full precision)."""
        return dict(self.totals)


def current() -> PhaseClock | None:
    """The active clock, or None."""
    return _CURRENT.get()


def phase(name: str):
    """``with phase("oracle"): ...`` counts the block for the current clock, if one is active."""
    clock = _CURRENT.get()
    return clock.phase(name) if clock is not None else contextlib.nullcontext()


#: Phases spent inside the solution's own calls: its correctness calls (first-call JIT compile
#: and autotuning included), the timing loop's warm-up calls and the timed samples.
SOLUTION_PHASES = ("worker_run", "timing_warmup", "timing_samples")


def harness_seconds(wall_s: float, phases_s: dict[str, float]) -> float:
    """Wall seconds not spent inside the solution's calls (:data:`SOLUTION_PHASES`): the
    harness's own work (worker start-up, inputs, expected values, checks, integrity calls and
    profiling, transfers, the store)."""
    return wall_s - sum(phases_s.get(k, 0.0) for k in SOLUTION_PHASES)
