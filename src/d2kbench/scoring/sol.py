"""Speed of light (SOL) and roofline figures (docs/timing.md, "Speed of light (SOL) and the roofline").

SOL time of a workload = max(tensor-core FLOPs / TC rate, FP32 FLOPs / FP32 rate,
minimal bytes / bandwidth), from the task's hand-written work formulas. Two ceiling tables:
vendor datasheet peaks and ceilings measured on our machines.
"""

from __future__ import annotations

from dataclasses import dataclass

from d2kbench.tasks.formula import evaluate_formula
from d2kbench.tasks.schema import WorkCounts


@dataclass(frozen=True)
class Ceilings:
    """Peak rates of one GPU: TFLOP/s (dense, no sparsity) and TB/s; ``source`` cites them."""

    name: str
    bf16_tflops: float
    fp8_tflops: float
    fp32_tflops: float
    hbm_tbps: float
    source: str


#: Vendor datasheet peaks (SXM parts, dense).
DATASHEET = {
    "H200": Ceilings("H200", 989.0, 1979.0, 67.0, 4.8, "NVIDIA H200 datasheet (SXM)"),
    "H100": Ceilings("H100", 989.0, 1979.0, 67.0, 3.35, "NVIDIA H100 datasheet (SXM)"),
    "B200": Ceilings("B200", 2250.0, 4500.0, 80.0, 8.0, "NVIDIA B200 datasheet (HGX, dense)"),
}
#: Ceilings measured on our H200 (Nov 2026; docs/timing.md has the table): 8192^3 bf16 GEMM
#: through PyTorch on random data in short bursts; device-to-device copy counting read+write.
MEASURED = {
    "H200": Ceilings("H200", 790.0, 1267.0, 60.0, 4.3, "measured on our H200, Nov 2026 (docs/timing.md)"),
}


#: The two ceiling tiers (docs/timing.md, "Speed of light (SOL) and the roofline"): ``datasheet`` is the physical
#: bound (a time under it is flagged); ``measured`` is what our machines reach in practice.
TIERS = {"datasheet": DATASHEET, "measured": MEASURED}


def ceilings(gpu: str, tier: str = "datasheet") -> Ceilings:
    """The ceilings of ``gpu`` (a table key such as ``"H200"`` or a name such as ``"NVIDIA H200"``).

    Raises:
        ValueError: an unknown tier, or a GPU the tier's table has no row for (the message lists
            the GPUs it knows; measured ceilings exist only where we measured them).
    """
    if tier not in TIERS:
        raise ValueError(f"unknown ceiling tier {tier!r} (known: {', '.join(TIERS)})")
    table = TIERS[tier]
    key = gpu_key(gpu) or gpu
    if key not in table:
        raise ValueError(f"no {tier} ceilings for GPU {gpu!r} (known: {', '.join(table)})")
    return table[key]


def gpu_key(gpu_name: str | None) -> str | None:
    """``"NVIDIA H200"`` -> ``"H200"`` (None when no table knows the GPU)."""
    if not gpu_name:
        return None
    for key in DATASHEET:
        if key in gpu_name.upper():
            return key
    return None


def sol_ms(counts: WorkCounts, axes: dict, ceil: Ceilings) -> tuple[float, str]:
    """SOL time in ms and the binding limit (``tensor_core``, ``fp32`` or ``memory``); the
    tensor-core FLOPs run at the rate of their precision (``counts.tc_precision``)."""
    tc_rate = ceil.fp8_tflops if counts.tc_precision == "fp8" else ceil.bf16_tflops
    terms = {
        "tensor_core": evaluate_formula(counts.tc_flops, axes) / (tc_rate * 1e12),
        "fp32": evaluate_formula(counts.fp32_flops, axes) / (ceil.fp32_tflops * 1e12),
        "memory": evaluate_formula(counts.bytes, axes) / (ceil.hbm_tbps * 1e12),
    }
    bind = max(terms, key=terms.__getitem__)
    return terms[bind] * 1e3, bind


def bound_of(spec, workload, ceil: Ceilings, launch_floor_ms: float | None = None,
             sol: tuple[float, str] | None = None) -> str:
    """``compute``, ``memory`` or ``latency``: what limits ``workload`` of task ``spec``.

    The workload's declared ``bound`` if any. Otherwise the largest term of the roofline of the
    task's floor work model on ``ceil``, extended by the launch floor: tensor-core or FP32
    FLOPs -> ``compute``, bytes -> ``memory``, and ``latency`` when that SOL time is below
    ``launch_floor_ms`` (the measured cost of launching anything; see
    :mod:`d2kbench.harness.launch_floor`), i.e. no kernel can come close to the roofline.
    ``sol``: that floor model's (SOL ms, binding limit) on ``ceil`` where the caller has it
    (:func:`sol_ms`); computed here otherwise.
    """
    if workload.bound is not None:
        return workload.bound
    ms, bind = sol or sol_ms(spec.sol.counts(spec.sol.floor), workload.axes, ceil)
    if launch_floor_ms is not None and ms < launch_floor_ms:
        return "latency"
    return "memory" if bind == "memory" else "compute"
