"""How long a worker may take for each request before it is killed (``timeout``).

With ``--timeout S`` every request may take ``S`` seconds. By default the limit follows the
workload: a fixed allowance (Python and Triton start-up, JIT compilation and autotuning of the
first call) plus a multiple of what the call should cost, never more than the task's own
``timeout_s``. What a call should cost is measured in the parent: the PyTorch reference's time
on the same inputs; a timing request may take a multiple of the solution's own slowest
correctness call. So a solution that hangs costs about a minute on the CPU, not the task's
10-15 minutes, and a slow but honest one is not cut off: the multiples are generous (the
Triton interpreter runs a kernel 100-1000x slower than PyTorch runs the reference on the CPU,
measured on the smoke workloads of the suite).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Seconds every request may take on top of its scaled share (start-up, compilation, autotuning).
ALLOWANCE_S = {"cpu": 60.0, "cuda": 300.0}
#: A correctness call may take this multiple of the reference's time on the same inputs.
CALL_FACTOR = {"cpu": 2000.0, "cuda": 200.0}
#: A timing request may take this multiple of the solution's slowest correctness call (CPU:
#: a few host-timed calls; GPU: warm-up, up to 200 samples, graph passes, profiled calls).
TIMING_FACTOR = {"cpu": 20.0, "cuda": 2000.0}
#: Worker start-up (import torch, initialise CUDA, import the solution).
START_S = {"cpu": 120.0, "cuda": 300.0}


@dataclass(frozen=True)
class Deadlines:
    """Request timeouts of one solution on one device (seconds).

    Args:
        device: ``cpu`` or ``cuda``.
        cap_s: the task's ``timeout_s``: no request may take longer.
        explicit_s: a timeout the user chose (``--timeout``): used for every request.
    """

    device: str
    cap_s: float
    explicit_s: float | None = None

    def _bound(self, seconds: float) -> float:
        return self.explicit_s if self.explicit_s is not None else min(self.cap_s, seconds)

    def start(self) -> float:
        """Worker start-up and the solution's import."""
        return self._bound(START_S.get(self.device, START_S["cuda"]))

    def call(self, reference_s: float | None) -> float:
        """One correctness call whose reference took ``reference_s`` (None: unknown)."""
        dev = self.device if self.device in ALLOWANCE_S else "cuda"
        if reference_s is None:
            return self._bound(self.cap_s)
        return self._bound(ALLOWANCE_S[dev] + CALL_FACTOR[dev] * reference_s)

    def timing(self, slowest_call_s: float | None) -> float:
        """One timing request of a solution whose slowest correctness call took ``slowest_call_s``."""
        dev = self.device if self.device in ALLOWANCE_S else "cuda"
        if slowest_call_s is None:
            return self._bound(self.cap_s)
        return self._bound(ALLOWANCE_S[dev] + TIMING_FACTOR[dev] * slowest_call_s)
