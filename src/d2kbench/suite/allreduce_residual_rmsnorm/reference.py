"""All-reduce + residual add + RMSNorm (+ optional FP8 1 x 128 group quantisation): the
tensor-parallel epilogue of a row-parallel linear layer, simulated on one device.

Under tensor parallelism of degree R every rank holds a partial output ``P_r [T, H]`` (bf16) of
the attention output projection or the MLP down projection; the layer's output is their sum.
For every token row ``t``::

    s        = sum_{r = 0 .. R-1} float32(P_r)                (FP32, in rank order 0, 1, ..., R-1)
    z        = bf16(float32(bf16(s)) + float32(residual))     (the new residual stream)
    residual <- z                                              (in place: a state update)
    rstd     = 1 / sqrt(mean_h(float32(z)^2) + eps)            (FP32)
    y        = (float32(z) * rstd) * float32(weight)           (FP32)

``quant = 0``: the output is ``bf16(y)`` and ``y_s`` is empty (``[T, 0]``). ``quant = 1`` (the
DeepSeek-V3 FP8 layers): per group ``g`` of ``GS`` consecutive columns ::

    y_s[t, g] = max(max_{h in g} |y[t, h]|, 1e-10) / 448
    y_q[t, h] = float8_e4m3fn(clamp(y[t, h] / y_s[t, g], -448, 448))

The R partials are R separate allocations (a Python list): a simulated rank's buffer as a
peer would map it through CUDA IPC or symmetric memory. On the CPU smoke workloads the inputs
may be float16 (parameter ``dtype``, every bf16 above read as the input dtype); with
``quant = 1`` the output is then a float16 carrier of ``clamp(y / y_s)`` without the FP8
rounding (parameter ``ydtype``).
"""

from __future__ import annotations

import torch

FP8_MAX = 448.0
SCALE_FLOOR = 1e-10


def y_dtype_for(dtype: torch.dtype, quant: int) -> torch.dtype:
    """dtype of ``y``: float8_e4m3fn for bf16 inputs with ``quant``, else the input dtype."""
    return torch.float8_e4m3fn if quant and dtype == torch.bfloat16 else dtype


def make_inputs(workload: dict, seed: int, device: str | torch.device) -> dict:
    """Draw the inputs of one call.

    Args:
        workload: axes ``R`` (ranks), ``T`` (tokens), ``H`` (hidden size), ``GS`` (quantisation
            group, 128; H a multiple of it), ``Q`` (1: FP8 group-quantised output, 0: bf16);
            params ``dtype`` (``bfloat16`` default, ``float16`` on CPU smoke runs) and
            ``variant``: ``normal`` (default: residual rows of log-normal magnitude, each rank's
            partial N(0, 1/(4R)) times the row magnitude, as the R shares of a layer output at
            half the residual's scale) or ``rank_outliers`` (row t's partial of rank t mod R is
            64x larger, and every fourth row cancels: rank R-1's partial is minus the bf16 sum
            of the others plus a small remainder: the sum is a few percent of the largest partial).
        seed: seed of a ``torch.Generator`` on ``device``.
        device: where the tensors are created.

    Returns:
        ``{"partials": list of R tensors [T, H], each its own allocation, "residual": [T, H],
        "weight": [H]`` (dtype as above, contiguous; weight ~ 1 + 0.3 N(0, 1)), ``"eps": 1e-6,
        "group_size": GS, "quant": Q}``.

    Raises:
        ValueError: H not a multiple of GS, Q not 0 or 1, or an unknown variant.
    """
    R, T, H, GS, Q = (int(workload[a]) for a in ("R", "T", "H", "GS", "Q"))
    if H % GS or Q not in (0, 1):
        raise ValueError(f"H={H} must be a multiple of GS={GS} and Q={Q} 0 or 1")
    dtype = getattr(torch, str(workload.get("dtype", "bfloat16")))
    variant = str(workload.get("variant", "normal"))
    if variant not in ("normal", "rank_outliers"):
        raise ValueError(f"unknown variant {variant!r} (normal, rank_outliers)")
    gen = torch.Generator(device=device).manual_seed(seed)
    mag = torch.exp(0.5 * torch.randn(T, 1, generator=gen, device=device))
    residual = (torch.randn(T, H, generator=gen, device=device) * mag).to(dtype)
    std = 0.5 / R ** 0.5
    parts = [torch.randn(T, H, generator=gen, device=device) * (std * mag) for _ in range(R)]
    if variant == "rank_outliers":
        rows = torch.arange(T, device=device)
        for r in range(R):
            parts[r][rows % R == r] *= 64.0
        if R > 1:
            cancel = rows % 4 == 3
            others = sum(p.to(dtype).float() for p in parts[:-1])
            parts[-1][cancel] = -others[cancel] + 1e-3 * parts[-1][cancel]
    weight = (1.0 + 0.3 * torch.randn(H, generator=gen, device=device)).to(dtype)
    partials = [p.to(dtype).contiguous() for p in parts]  # R separate allocations
    return {"partials": partials, "residual": residual.contiguous(), "weight": weight, "eps": 1e-6,
            "group_size": GS, "quant": Q}


def reduce_partials(partials: list[torch.Tensor]) -> torch.Tensor:
    """``sum_r float32(P_r)`` in rank order (FP32 ``[T, H]``): the all-reduce of the task."""
    s = partials[0].float()
    for p in partials[1:]:
        s = s + p.float()
    return s


def epilogue(s: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, group_size: int,
             quant: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add + RMSNorm (+ group quantisation) of the reduced sum ``s`` (FP32 ``[T, H]``).

    Updates ``residual`` ([T, H], bf16 or float16) in place with ``bf16(bf16(s) + residual)`` and
    returns ``(y [T, H], y_s [T, H / group_size] float32, or [T, 0] without quant)`` as in the
    module docstring. Shared by :func:`run` and the torch.distributed ground truth of the tests.
    """
    T, H = residual.shape
    dtype = residual.dtype
    z = (s.to(dtype).float() + residual.float()).to(dtype)
    residual.copy_(z)
    zf = z.float()
    rstd = torch.rsqrt(zf.pow(2).mean(dim=-1, keepdim=True) + eps)
    y = (zf * rstd) * weight.float()
    if not quant:
        return y.to(dtype), torch.empty((T, 0), dtype=torch.float32, device=s.device)
    G = H // group_size
    yg = y.view(T, G, group_size)
    scales = yg.abs().amax(dim=-1).clamp_min(SCALE_FLOOR) / FP8_MAX
    q = (yg / scales[..., None]).clamp(-FP8_MAX, FP8_MAX).to(y_dtype_for(dtype, quant)).view(T, H)
    return q, scales.contiguous()


def run(partials: list[torch.Tensor], residual: torch.Tensor, weight: torch.Tensor, eps: float, group_size: int,
        quant: int):
    """Reference all-reduce (rank-order FP32 sum) + residual add + RMSNorm (+ FP8 group quantisation).

    Args:
        partials: list of R tensors ``[T, H]`` bfloat16 (float16 on smoke runs), the ranks'
            partial outputs, each its own allocation; never modified.
        residual: ``[T, H]`` same dtype; overwritten with ``bf16(bf16(sum) + residual)``.
        weight: ``[H]`` same dtype, the RMSNorm gain.
        eps: RMSNorm epsilon (1e-6).
        group_size: columns per quantisation group (128).
        quant: 1 for the FP8 group-quantised output, 0 for bf16.

    Returns:
        ``(y [T, H], y_s [T, H / group_size] float32 (``[T, 0]`` when quant = 0))``.

    Raises:
        ValueError: an empty list of partials.
    """
    if not partials:
        raise ValueError("partials must hold at least one rank's tensor")
    return epilogue(reduce_partials(list(partials)), residual, weight, eps, group_size, quant)
