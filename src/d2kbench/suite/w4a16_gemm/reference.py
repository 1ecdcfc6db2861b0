"""AWQ W4A16 GEMM (int4 weights, group size 128, zero points, fp16 scales): inputs and reference.

The operator (AutoAWQ / vLLM ``awq_gemm``). The weight ``W [K, N]`` is stored as unsigned
4-bit codes ``q`` with one zero point ``z`` and one fp16 scale ``s`` per (group of G = 128
consecutive K rows, column)::

    W[k, n] = fp16( (q[k, n] - z[k // G, n]) * s[k // G, n] )
    y[m, n] = fp16( sum_k x[m, k] * W[k, n] )          (FP32 accumulation)

Packing (AWQ's layout, shared by the AutoAWQ checkpoints): ``qweight [K, N/8]`` int32 holds
8 consecutive columns per word, ``qzeros [K/G, N/8]`` int32 the zero points the same way, and
``scales [K/G, N]`` fp16. Within a word the 4-bit field at bits ``4 i .. 4 i + 3`` holds column
``8 p + AWQ_ORDER[i]`` with ``AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]`` (so the fields at bits
``4 j`` and ``16 + 4 j`` are the adjacent columns ``2 j`` and ``2 j + 1``). Because
``q - z`` is an exact small integer, ``W`` is determined bit for bit; the reference rounds it
to fp16 (as dequantise-then-GEMM does) and multiplies in FP32 (TF32 off).
"""

from __future__ import annotations

import torch

#: Nibble ``i`` of a packed word holds column ``AWQ_ORDER[i]`` of its group of 8 columns.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
PACK = 8


def pack_awq(codes: torch.Tensor) -> torch.Tensor:
    """Pack unsigned 4-bit ``codes [R, N]`` (values 0..15, N a multiple of 8) into AWQ words
    ``[R, N/8]`` int32 (field ``i`` of word ``p`` = column ``8 p + AWQ_ORDER[i]``)."""
    R, N = codes.shape
    c = codes.to(torch.int64).view(R, N // PACK, PACK)
    word = torch.zeros(R, N // PACK, dtype=torch.int64, device=codes.device)
    for i, col in enumerate(AWQ_ORDER):
        word |= c[:, :, col] << (4 * i)
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def unpack_awq(words: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_awq`: ``[R, N/8]`` int32 -> ``[R, N]`` int32 codes 0..15."""
    R, P = words.shape
    w = words.to(torch.int64) & 0xFFFFFFFF
    out = torch.empty(R, P, PACK, dtype=torch.int32, device=words.device)
    for i, col in enumerate(AWQ_ORDER):
        out[:, :, col] = ((w >> (4 * i)) & 0xF).to(torch.int32)
    return out.view(R, P * PACK)


def make_inputs(workload: dict, seed: int, device: str | torch.device) -> dict:
    """Draw the inputs of one call.

    Args:
        workload: axes ``M`` (tokens), ``N`` (output features, a multiple of 8), ``K`` (input
            features), ``G`` (group size, 128; K a multiple of it); param ``variant``:
            ``normal`` (default: codes and zero points uniform in 0..15, log-normal scales)
            or ``extreme`` (codes and zero points drawn from {0, 15} with a few uniform ones:
            the top nibble of most words is set, so sign-extending shifts, a dropped mask or
            a wrong nibble order show).
        seed: seed of a ``torch.Generator`` on ``device``.
        device: where the tensors are created.

    Returns:
        ``{"x": [M, K] float16, "qweight": [K, N/8] int32, "qzeros": [K/G, N/8] int32,
        "scales": [K/G, N] float16, "group_size": G}``; scales are sized so that
        ``W ~ N(0, 1/K)`` and y is O(1).

    Raises:
        ValueError: N not a multiple of 8, K not a multiple of G, or an unknown variant.
    """
    M, N, K, G = (int(workload[a]) for a in ("M", "N", "K", "G"))
    if N % PACK or K % G:
        raise ValueError(f"N={N} must be a multiple of 8 and K={K} of G={G}")
    variant = str(workload.get("variant", "normal"))
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randint(0, 16, (K, N), generator=gen, device=device, dtype=torch.int32)
    z = torch.randint(0, 16, (K // G, N), generator=gen, device=device, dtype=torch.int32)
    if variant == "extreme":
        q = torch.where(torch.rand(K, N, generator=gen, device=device) < 0.9,
                        15 * torch.randint(0, 2, (K, N), generator=gen, device=device, dtype=torch.int32), q)
        z = torch.where(torch.rand(K // G, N, generator=gen, device=device) < 0.9,
                        15 * torch.randint(0, 2, (K // G, N), generator=gen, device=device, dtype=torch.int32), z)
    elif variant != "normal":
        raise ValueError(f"unknown variant {variant!r} (normal, extreme)")
    spread = 10.0 if variant == "extreme" else 6.5
    s = torch.exp(0.2 * torch.randn(K // G, N, generator=gen, device=device)) / (spread * K ** 0.5)
    x = torch.randn(M, K, generator=gen, device=device)
    return {"x": x.to(torch.float16), "qweight": pack_awq(q), "qzeros": pack_awq(z),
            "scales": s.to(torch.float16), "group_size": G}


def dequantize(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """``W [K, N]`` float16 = fp16((q - z) * s) (exact in FP32 before the one rounding)."""
    q = unpack_awq(qweight)
    z = unpack_awq(qzeros).repeat_interleave(group_size, dim=0)
    s = scales.float().repeat_interleave(group_size, dim=0)
    return ((q - z).float() * s).to(torch.float16)


def run(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
        group_size: int) -> torch.Tensor:
    """Reference AWQ W4A16 GEMM.

    Args:
        x: ``[M, K]`` float16 activations.
        qweight: ``[K, N/8]`` int32 AWQ-packed 4-bit weight codes.
        qzeros: ``[K/G, N/8]`` int32 AWQ-packed 4-bit zero points.
        scales: ``[K/G, N]`` float16 group scales.
        group_size: G (128).

    Returns:
        ``y [M, N]`` float16, contiguous: ``x @ W`` with FP32 accumulation.
    """
    W = dequantize(qweight, qzeros, scales, group_size)
    return (x.float() @ W.float()).to(torch.float16)
