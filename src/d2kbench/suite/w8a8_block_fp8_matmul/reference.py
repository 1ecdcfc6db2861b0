"""Block-scaled FP8 GEMM (DeepSeek-V3 W8A8 linear layers): inputs and PyTorch reference.

The operator. ``A [M, K]`` holds FP8 e4m3 activations quantised per 1 x 128 group (one FP32
scale per row and 128-wide K block, ``As [M, K/128]``); ``B [N, K]`` holds FP8 e4m3 weights
quantised per 128 x 128 block (``Bs [ceil(N/128), K/128]``; the last N block may be partial,
e.g. N = 2112 = 16.5 blocks). With ``kb`` the K block and ``nb = n // 128``::

    C[m, n] = sum_kb  As[m, kb] * Bs[nb, kb] * sum_{k in kb} A[m, k] * B[n, k]

accumulated in FP32 and rounded once to bfloat16. This is DeepSeek-V3's fine-grained FP8
scheme (the format of its checkpoints and of DeepGEMM's ``fp8_gemm_nt``; vLLM's and SGLang's
``w8a8_block_fp8_matmul``). The reference dequantises both operands to FP32 and runs one FP32
GEMM (TF32 off): the products of two e4m3 values are exact in FP32, so it is the FP32-exact
value up to summation order.

On some CPU smoke workloads the quantised operands are carried in float16 (parameter
``qdtype``; every e4m3 value is exactly representable in float16) and C is float16; C is
bfloat16 whenever the operands are FP8.
"""

from __future__ import annotations

import torch

#: Quantisation block: 1 x 128 activation groups, 128 x 128 weight blocks (DeepSeek-V3).
BLOCK = 128
#: Largest finite float8 e4m3fn value.
FP8_MAX = 448.0


def out_dtype_for(a: torch.Tensor) -> torch.dtype:
    """The dtype of C: bfloat16 for FP8 operands, the carrier dtype (float16) on CPU smoke runs."""
    return torch.bfloat16 if a.dtype == torch.float8_e4m3fn else a.dtype


def _quantize_blocks(w: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``w [R, C]`` (FP32) per ``rows x cols`` block to e4m3 codes (as FP32 values) and
    FP32 scales ``amax / 448`` of shape ``[ceil(R/rows), C/cols]`` (a partial last row block
    takes the amax of its own rows)."""
    R, C = w.shape
    Rp = (R + rows - 1) // rows * rows
    pad = torch.zeros(Rp, C, dtype=w.dtype, device=w.device)
    pad[:R] = w
    blk = pad.view(Rp // rows, rows, C // cols, cols)
    s = blk.abs().amax(dim=(1, 3)).clamp_min(1e-10) / FP8_MAX
    q = (blk / s[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float()
    return q.view(Rp, C)[:R], s


def make_inputs(workload: dict, seed: int, device: str | torch.device) -> dict:
    """Draw the inputs of one call.

    Args:
        workload: axes ``M`` (tokens), ``N`` (output features), ``K`` (input features, a
            multiple of 128); params ``qdtype`` (``float8_e4m3fn`` default; ``float16`` carries
            the same codes on CPU smoke runs) and ``variant``: ``normal`` (default: Gaussian
            activations with a log-normal per-token magnitude, weights ~ N(0, 1/K) with a
            log-normal per-block magnitude) or ``scale_spread`` (every activation group and
            weight block additionally scaled by 2^j, j uniform in [-8, 8] for activation
            groups and in [-6, 0] for weight blocks: the scales of one row differ by up to 2^16
            across K blocks, so applying any single scale per row or per tile after the K loop
            is far off, while C stays inside the float16 range of the smoke runs).
        seed: seed of a ``torch.Generator`` on ``device``.
        device: where the tensors are created.

    Returns:
        ``{"A": [M, K], "As": [M, K/128] float32, "B": [N, K], "Bs": [ceil(N/128), K/128]
        float32}``, A and B in ``qdtype``, all contiguous; scales are ``amax / 448`` of their
        group or block (as produced by per-token-group quantisation and DeepSeek-V3's
        checkpoints).

    Raises:
        ValueError: K not a multiple of 128, or an unknown variant.
    """
    M, N, K = (int(workload[a]) for a in ("M", "N", "K"))
    if K % BLOCK:
        raise ValueError(f"K={K} must be a multiple of {BLOCK}")
    variant = str(workload.get("variant", "normal"))
    qdtype = getattr(torch, str(workload.get("qdtype", "float8_e4m3fn")))
    gen = torch.Generator(device=device).manual_seed(seed)
    KB, NB = K // BLOCK, (N + BLOCK - 1) // BLOCK
    x = torch.randn(M, K, generator=gen, device=device) * torch.exp(0.5 * torch.randn(M, 1, generator=gen, device=device))
    w = torch.randn(N, K, generator=gen, device=device) * K ** -0.5
    wmag = torch.exp(0.3 * torch.randn(NB, KB, generator=gen, device=device))
    if variant == "scale_spread":
        x = x * torch.exp2(torch.randint(-8, 9, (M, KB), generator=gen, device=device).float()).repeat_interleave(BLOCK, 1)
        wmag = wmag * torch.exp2(torch.randint(-6, 1, (NB, KB), generator=gen, device=device).float())
    elif variant != "normal":
        raise ValueError(f"unknown variant {variant!r} (normal, scale_spread)")
    w = w * wmag.repeat_interleave(BLOCK, 0)[:N].repeat_interleave(BLOCK, 1)
    a_q, a_s = _quantize_blocks(x, 1, BLOCK)
    b_q, b_s = _quantize_blocks(w, BLOCK, BLOCK)
    return {"A": a_q.to(torch.float8_e4m3fn).to(qdtype).contiguous(), "As": a_s.contiguous(),
            "B": b_q.to(torch.float8_e4m3fn).to(qdtype).contiguous(), "Bs": b_s.contiguous()}


def dequantize(A: torch.Tensor, As: torch.Tensor, B: torch.Tensor, Bs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FP32 ``(A * As, B * Bs)``, each scale broadcast over its group / block (ragged N clipped)."""
    N = B.shape[0]
    a = A.float() * As.repeat_interleave(BLOCK, dim=1)
    b = B.float() * Bs.repeat_interleave(BLOCK, dim=0)[:N].repeat_interleave(BLOCK, dim=1)
    return a, b


def run(A: torch.Tensor, As: torch.Tensor, B: torch.Tensor, Bs: torch.Tensor) -> torch.Tensor:
    """Reference block-scaled FP8 GEMM ``C = (A * As) @ (B * Bs)^T``.

    Args:
        A: ``[M, K]`` float8_e4m3fn (float16 carrier on CPU smoke runs), K-contiguous.
        As: ``[M, K/128]`` float32, one scale per row and 128-wide K block.
        B: ``[N, K]`` float8_e4m3fn (or the float16 carrier), K-contiguous.
        Bs: ``[ceil(N/128), K/128]`` float32, one scale per 128 x 128 weight block.

    Returns:
        ``C [M, N]`` bfloat16 (float16 for float16 carriers), contiguous.
    """
    a, b = dequantize(A, As, B, Bs)
    return (a @ b.T).to(out_dtype_for(A))
