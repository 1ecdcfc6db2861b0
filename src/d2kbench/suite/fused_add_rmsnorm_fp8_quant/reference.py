"""Fused residual add + RMSNorm + per-token-group (1 x 128) FP8 quantisation: inputs and reference.

The operator (the prologue of every FP8 linear layer in DeepSeek-V3 / Qwen3-FP8 serving).
For every token row ``t`` of ``x [T, H]`` and ``residual [T, H]`` (bf16)::

    z        = bf16(float32(x) + float32(residual))          (the new residual stream)
    residual <- z                                             (in place: a state update)
    rstd     = 1 / sqrt(mean_h(float32(z)^2) + eps)           (FP32)
    y        = (float32(z) * rstd) * float32(weight)          (FP32, the RMSNorm output)

then per group ``g`` of ``GS`` (128) consecutive columns, as per-token-group quantisation::

    s[t, g]  = max(max_{h in g} |y[t, h]|, 1e-10) / 448        (FP32)
    q[t, h]  = float8_e4m3fn(clamp(y[t, h] / s[t, g], -448, 448))   (round to nearest even)

Outputs ``x_q [T, H]`` (row-major) and ``x_s`` of logical shape ``[T, H / GS]``, row-major
(strides ``(H/GS, 1)``) or, with ``column_major_scales``, column-major and TMA-aligned as
DeepGEMM reads it (strides ``(1, Tp)``, ``Tp = 4 * ceil(T / 4)``; the padding rows are not
part of the output).

On some CPU smoke workloads the inputs are float16 (parameter ``dtype``) and ``x_q`` is a
float16 carrier of ``clamp(y / s)`` without the FP8 rounding (parameter ``qdtype``); ``x_q``
is float8_e4m3fn whenever the inputs are bf16.
"""

from __future__ import annotations

import torch

FP8_MAX = 448.0
SCALE_FLOOR = 1e-10


def q_dtype_for(x: torch.Tensor) -> torch.dtype:
    """dtype of ``x_q``: float8_e4m3fn for bf16 inputs, the input dtype (float16 carrier) otherwise."""
    return torch.float8_e4m3fn if x.dtype == torch.bfloat16 else x.dtype


def make_inputs(workload: dict, seed: int, device: str | torch.device) -> dict:
    """Draw the inputs of one call.

    Args:
        workload: axes ``T`` (tokens), ``H`` (hidden size), ``GS`` (group size, 128; H a
            multiple of it); params ``dtype`` (``bfloat16`` default, ``float16`` on CPU smoke
            runs), ``column_major`` (bool) and ``variant``: ``normal`` (default: residual rows
            with a log-normal magnitude, the layer output x at half of it), ``magnitudes``
            (row magnitudes spread over 1e-3 .. 1e3, so eps matters on the small rows, and 1%
            of the rows with x = -residual exactly: z = 0, the scale floor) or ``zero_groups``
            (3% of the 128-column groups zero in both x and residual, and a few outlier
            channels at 64x the row scale).
        seed: seed of a ``torch.Generator`` on ``device``.
        device: where the tensors are created.

    Returns:
        ``{"x": [T, H], "residual": [T, H], "weight": [H]`` (dtype as above, contiguous;
        weight ~ 1 + 0.3 N(0, 1) like trained RMSNorm gains), ``"eps": 1e-6, "group_size": GS,
        "column_major_scales": bool}``.

    Raises:
        ValueError: H not a multiple of GS, or an unknown variant.
    """
    T, H, GS = (int(workload[a]) for a in ("T", "H", "GS"))
    if H % GS:
        raise ValueError(f"H={H} must be a multiple of GS={GS}")
    dtype = getattr(torch, str(workload.get("dtype", "bfloat16")))
    variant = str(workload.get("variant", "normal"))
    gen = torch.Generator(device=device).manual_seed(seed)
    if variant == "magnitudes":
        mag = 10.0 ** (6.0 * torch.rand(T, 1, generator=gen, device=device) - 3.0)
    else:
        mag = torch.exp(0.5 * torch.randn(T, 1, generator=gen, device=device))
    r = torch.randn(T, H, generator=gen, device=device) * mag
    x = 0.5 * torch.randn(T, H, generator=gen, device=device) * mag
    if variant == "magnitudes":
        r = r.to(dtype).float()
        zero_rows = torch.rand(T, 1, generator=gen, device=device) < 0.01
        zero_rows[0] = True
        x = torch.where(zero_rows, -r, x)
    elif variant == "zero_groups":
        keep = (torch.rand(T, H // GS, 1, generator=gen, device=device) >= 0.03).float()
        x = (x.view(T, H // GS, GS) * keep).view(T, H)
        r = (r.view(T, H // GS, GS) * keep).view(T, H)
        ch = torch.randperm(H, generator=gen, device=device)[: max(1, H // 256)]
        r[:, ch] *= 64.0
    elif variant != "normal":
        raise ValueError(f"unknown variant {variant!r} (normal, magnitudes, zero_groups)")
    w = 1.0 + 0.3 * torch.randn(H, generator=gen, device=device)
    return {"x": x.to(dtype).contiguous(), "residual": r.to(dtype).contiguous(), "weight": w.to(dtype),
            "eps": 1e-6, "group_size": GS, "column_major_scales": bool(workload.get("column_major", False))}


def run(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, group_size: int,
        column_major_scales: bool):
    """Reference fused add + RMSNorm + 1 x group_size FP8 quantisation (updates ``residual``).

    Args:
        x: ``[T, H]`` bfloat16 (float16 on smoke runs), the sublayer output; never modified.
        residual: ``[T, H]`` same dtype, the residual stream; overwritten with ``x + residual``.
        weight: ``[H]`` same dtype, the RMSNorm gain.
        eps: RMSNorm epsilon (1e-6).
        group_size: columns per quantisation group (128).
        column_major_scales: return ``x_s`` column-major, TMA-aligned.

    Returns:
        ``(x_q [T, H], x_s [T, H / group_size] float32)`` as in the module docstring.
    """
    T, H = x.shape
    G = H // group_size
    z = (x.float() + residual.float()).to(x.dtype)
    residual.copy_(z)
    zf = z.float()
    rstd = torch.rsqrt(zf.pow(2).mean(dim=-1, keepdim=True) + eps)
    y = ((zf * rstd) * weight.float()).view(T, G, group_size)
    s = y.abs().amax(dim=-1).clamp_min(SCALE_FLOOR) / FP8_MAX
    q = (y / s[..., None]).clamp(-FP8_MAX, FP8_MAX).to(q_dtype_for(x)).view(T, H)
    if column_major_scales:
        Tp = (T + 3) // 4 * 4
        scales = torch.empty((G, Tp), dtype=torch.float32, device=x.device)[:, :T].T
        scales.copy_(s)
    else:
        scales = s.contiguous()
    return q, scales
