"""The Triton launch counter of the worker's monitors (:class:`~d2kbench.integrity.guard.Guard`).

Class-level wrappers on ``JITFunction.run`` and the interpreter's ``InterpretedFunction.run``
(so launches are counted under ``TRITON_INTERPRET=1`` too) count every launch by kernel name and
grid. The guard compares the counts between calls (a timed call that launches other kernels or
grids than the checked one) and between eager calls and graph replays. Installed with the guard,
before the solution is imported; its functions are in the guard's identity snapshot
(``guard.HARNESS_MODULES``).
"""

from __future__ import annotations

from collections import Counter

# Imports inside functions: triton loads when the counter is installed (the worker's monitors are
# installed after its measured torch import).


def grid_key(grid) -> tuple:
    """A launch grid as a plain tuple padded to three dimensions (``(8,)`` -> ``(8, 1, 1)``)."""
    try:
        dims = tuple(int(g) for g in grid)
    except TypeError:
        dims = (int(grid),)
    return dims + (1,) * (3 - len(dims))


class Launches:
    """Counts Triton launches by (kernel name, grid) (class-level wrappers on the two ``run``
    methods; a grid given as a function is recorded with the value it returns)."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()  # (kernel name, (gx, gy, gz)) -> launches
        self.installed: list[str] = []
        from triton.runtime.jit import JITFunction

        classes = [JITFunction]
        try:
            from triton.runtime.interpreter import InterpretedFunction

            classes.append(InterpretedFunction)
        except ImportError:  # pragma: no cover - very old Triton
            pass
        counts = self.counts
        for cls in classes:
            original = cls.run

            def run(self, *args, _d2k_original=original, **kwargs):
                if not kwargs.get("warmup", False):
                    fn = getattr(self, "fn", None)
                    name = getattr(fn, "__name__", None) or getattr(self, "__name__", "?")
                    grid = kwargs.get("grid")
                    if callable(grid):
                        def spied(meta, _grid=grid, _name=name):
                            g = _grid(meta)
                            counts[(_name, grid_key(g))] += 1
                            return g

                        kwargs["grid"] = spied
                    else:
                        counts[(name, grid_key(grid) if grid is not None else ())] += 1
                return _d2k_original(self, *args, **kwargs)

            run.__qualname__ = f"{cls.__name__}.run"
            run.__doc__ = original.__doc__
            cls.run = run
            self.installed.append(f"{cls.__module__}.{cls.__name__}.run")

    def take(self) -> Counter:
        """Launches by (kernel, grid) since the last take (and reset)."""
        out = Counter(self.counts)
        self.counts.clear()
        return out

    @staticmethod
    def names(launched: Counter) -> Counter:
        """Launches by kernel name alone."""
        out: Counter = Counter()
        for (name, _grid), n in launched.items():
            out[name] += n
        return out


def describe_launches(sig: Counter) -> str:
    return ", ".join(f"{name}{list(grid)} x{n}" for (name, grid), n in sorted(sig.items())) or "none"
