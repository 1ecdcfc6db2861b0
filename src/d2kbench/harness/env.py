"""Environment fingerprint recorded with every evaluation: GPU, driver, clocks, versions."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from datetime import datetime, timezone

from d2kbench.sandbox import bwrap, seccomp

# Imports inside functions: torch and triton load when the environment is fingerprinted.

_SMI_FIELDS = (
    "name", "driver_version", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem",
    "power.limit", "temperature.gpu", "persistence_mode",
)


def nvidia_smi() -> dict:
    """Current GPU state from ``nvidia-smi`` (empty dict where it is absent or fails)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return {}
    try:
        out = subprocess.run(
            [exe, f"--query-gpu={','.join(_SMI_FIELDS)}", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True, text=True, timeout=15, check=True,
        ).stdout.strip()
    except (subprocess.SubprocessError, OSError):
        return {}
    values = [v.strip() for v in out.split(",")]
    return dict(zip(_SMI_FIELDS, values)) if len(values) == len(_SMI_FIELDS) else {}


def fingerprint(device: str) -> dict:
    """Versions and hardware of this machine, and how solutions are isolated (``sandbox``:
    bubblewrap's version, or ``none`` with the reason); for ``device == "cuda"`` also GPU
    properties and the clocks at the time of the call (record them before and after timing).

    Raises:
        d2kbench.sandbox.bwrap.SandboxUnavailable: ``D2K_SANDBOX=require`` without a sandbox.
    """
    import torch
    import triton

    import d2kbench

    env = {
        "time_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "d2kbench": d2kbench.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "sandbox": bwrap.status().describe(),  # how untrusted code was isolated (none: say why)
        "process_filter": seccomp.describe(device),  # whether solution workers can start processes
    }
    if device == "cuda" and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update({
            "gpu": p.name,
            "sm_count": p.multi_processor_count,
            "capability": f"{p.major}.{p.minor}",
            "gpu_memory_gib": round(p.total_memory / 2**30, 1),
            "l2_cache_mib": round(getattr(p, "L2_cache_size", 0) / 2**20, 1),
            "cuda_runtime": torch.version.cuda,
        })
        smi = nvidia_smi()
        if smi:
            env["driver"] = smi.get("driver_version")
            env["smi"] = smi
    return env
