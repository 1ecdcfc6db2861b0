"""Per-token-group FP8 quantisation (1 x group_size, dynamic scales): inputs and PyTorch
reference.

The operator. ``x [M, K]`` bf16 is cut into groups of ``group_size`` (128) consecutive
elements of a row. For each group ``g`` of row ``m``:

* ``amax = max(max |x|, 1e-10)`` (FP32; the ``1e-10`` floor keeps all-zero groups finite);
* ``s = amax / 448`` as a correctly rounded FP32 division (448 is the largest e4m3 value);
  with ``scale_ue8m0`` the scale is then rounded *up* to a power of two (the UE8M0 format of
  DeepSeek-V3.1 / DeepGEMM, still stored as FP32): ``2 ** ceil(log2 s)``, computed exactly on
  the bits of ``s``;
* ``q = float8_e4m3fn(clamp(x / s, -448, 448))``, rounding to nearest even.

Outputs: ``x_q [M, K]`` float8_e4m3fn (row-major) and ``x_s`` FP32 of logical shape
``[M, K / group_size]``, laid out either row-major (strides ``(K/gs, 1)``) or, with
``column_major_scales``, column-major and TMA-aligned as DeepGEMM's SM90 kernels read it:
strides ``(1, Mp)`` with ``Mp = 4 * ceil(M / 4)`` (each group column is contiguous and
starts 16-byte aligned; the ``Mp - M`` padding rows are not part of the output).
"""

from __future__ import annotations

import torch

FP8_MAX = 448.0
EPS = 1e-10


def make_inputs(workload: dict, seed: int, device: str | torch.device) -> dict:
    """Draw the inputs of one call.

    Args:
        workload: axes ``M`` (rows: tokens), ``K`` (columns), ``GS`` (group size), and params
            ``column_major`` (bool, default False), ``ue8m0`` (bool, default False) and
            ``variant``: ``"normal"`` (default: Gaussian rows with a log-normal per-token
            magnitude, as activations are), ``"outliers"`` (plus 1% of channels at +-1e4 in
            random rows and ~3% of the groups all zero) or ``"pow2_amax"`` (one element per
            group set to +-1.75 * 2**j, so that amax / 448 is an exact power of two: the
            UE8M0 rounding must not move it up).
        seed: seed of a ``torch.Generator`` on ``device``.
        device: where the tensors are created.

    Returns:
        ``{"x": Tensor[M, K] bfloat16 contiguous, "group_size": GS,
        "column_major_scales": bool, "scale_ue8m0": bool}``.
    """
    M, K, GS = int(workload["M"]), int(workload["K"]), int(workload["GS"])
    variant = workload.get("variant", "normal")
    gen = torch.Generator(device=device).manual_seed(seed)
    mag = torch.exp(0.5 * torch.randn(M, 1, generator=gen, device=device))
    x = torch.randn(M, K, generator=gen, device=device) * mag
    if variant == "outliers":
        ch = torch.randperm(K, generator=gen, device=device)[: max(1, K // 100)]
        rows = torch.rand(M, generator=gen, device=device) < 0.5
        sign = torch.where(torch.rand(M, ch.numel(), generator=gen, device=device) < 0.5, -1.0, 1.0)
        x[:, ch] = torch.where(rows[:, None], 1e4 * sign, x[:, ch])
        zero = torch.rand(M, K // GS, generator=gen, device=device) < 0.03
        x = x.view(M, K // GS, GS).masked_fill(zero[..., None], 0.0).view(M, K)
    elif variant == "pow2_amax":
        G = K // GS
        xg = (x.view(M, G, GS) / (x.view(M, G, GS).abs().amax(-1, keepdim=True) + 1e-6)).clone()  # |x| < 1
        j = torch.randint(-6, 6, (M, G), generator=gen, device=device).float()
        pos = torch.randint(0, GS, (M, G, 1), generator=gen, device=device)
        sign = torch.where(torch.rand(M, G, 1, generator=gen, device=device) < 0.5, -1.0, 1.0)
        peak = sign * 1.75 * torch.exp2(j)[..., None]
        xg = xg * torch.exp2(j)[..., None]                      # |x| < 2**j < 1.75 * 2**j
        x = xg.scatter(2, pos, peak).view(M, K)
    elif variant != "normal":
        raise ValueError(f"unknown variant {variant!r}")
    return {"x": x.to(torch.bfloat16).contiguous(), "group_size": GS,
            "column_major_scales": bool(workload.get("column_major", False)),
            "scale_ue8m0": bool(workload.get("ue8m0", False))}


def round_scale_ue8m0(s: torch.Tensor) -> torch.Tensor:
    """Positive normal FP32 ``s`` -> the smallest power of two >= s (exact, on the bits)."""
    bits = s.contiguous().view(torch.int32)
    return ((bits + 0x7FFFFF) & 0x7F800000).view(torch.float32)


def scale_strides(M: int, groups: int, column_major: bool) -> tuple[int, int]:
    """Element strides of ``x_s [M, groups]``: ``(groups, 1)`` or ``(1, 4 * ceil(M / 4))``."""
    return (1, (M + 3) // 4 * 4) if column_major else (groups, 1)


def run(x: torch.Tensor, group_size: int, column_major_scales: bool, scale_ue8m0: bool):
    """Reference quantisation.

    Args:
        x: ``[M, K]`` bfloat16, ``K`` a multiple of ``group_size``.
        group_size: elements per group (128 in the registered workloads).
        column_major_scales: scales column-major, TMA-aligned (strides ``(1, 4 ceil(M/4))``).
        scale_ue8m0: round the scales up to powers of two.

    Returns:
        ``(x_q [M, K] float8_e4m3fn, x_s [M, K / group_size] float32)`` with the layout above.
    """
    M, K = x.shape
    G = K // group_size
    xg = x.to(torch.float32).view(M, G, group_size)
    amax = xg.abs().amax(dim=-1).clamp_min(EPS)
    s = amax / FP8_MAX
    if scale_ue8m0:
        s = round_scale_ue8m0(s)
    q = (xg / s[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(M, K)
    if column_major_scales:
        Mp = (M + 3) // 4 * 4
        buf = torch.empty((G, Mp), dtype=torch.float32, device=x.device)
        scales = buf[:, :M].T
        scales.copy_(s)
    else:
        scales = s.contiguous()
    return q, scales
