"""Muon orthogonalisation with Polar Express coefficients: inputs and PyTorch reference.

The operator (paper Appendix B.1). For a batch of BF16 matrices
``G[b]`` of shape ``M x N``:

1. If ``M > N`` the matrix is transposed, so that the iterate is always wide (rows <= cols).
2. ``X0 = G / (||G||_F * 1.02 + 1e-6)`` per matrix, computed in FP32, then cast to FP16.
3. Five distinct Polar Express triples ``(a_k, b_k, c_k)`` are applied in order:
   ``A = X X^T; B = b_k A + c_k A^2; X = a_k X + B X``.
4. The result is transposed back if needed and returned as BF16 of the input's shape.

``run`` is the timed baseline (FP16 iterate, cuBLAS matmuls on the GPU). ``oracle`` is the
same map evaluated in FP64 (normalisation included), the high-precision target the tolerance
in ``task.yaml`` is measured against.
"""

from __future__ import annotations

import torch

#: Polar Express coefficients for 5 iterations (safety 2e-2, cushion 2), paper Appendix B.1.
POLAR_EXPRESS_COEFFS: tuple[tuple[float, float, float], ...] = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)
NUM_STEPS = 5
NORM_SCALE = 1.02
NORM_EPS = 1e-6


def make_inputs(workload: dict, seed: int, device: str | torch.device) -> dict:
    """Draw the inputs of one call.

    Args:
        workload: axis values ``{"B": int, "M": int, "N": int}`` and optionally
            ``"variant"``: ``"gaussian"`` (default), ``"low_rank_noise"`` (rank-8 signal plus
            1e-3 noise) or ``"ill_conditioned"`` (singular values spread over 1e-6 .. 1).
        seed: seed of a ``torch.Generator`` on ``device``; the same seed gives the same inputs.
        device: where the tensors are created.

    Returns:
        ``{"G": Tensor[B, M, N] bfloat16 contiguous, "steps": 5}``.
    """
    B, M, N = int(workload["B"]), int(workload["M"]), int(workload["N"])
    variant = workload.get("variant", "gaussian")
    gen = torch.Generator(device=device).manual_seed(seed)
    if variant == "gaussian":
        G = torch.randn(B, M, N, generator=gen, device=device, dtype=torch.float32)
    elif variant == "low_rank_noise":
        r = min(8, M, N)
        U = torch.randn(B, M, r, generator=gen, device=device)
        V = torch.randn(B, r, N, generator=gen, device=device)
        noise = torch.randn(B, M, N, generator=gen, device=device)
        G = U @ V / r**0.5 + 1e-3 * noise
    elif variant == "ill_conditioned":
        k = min(M, N)
        U, _ = torch.linalg.qr(torch.randn(B, M, k, generator=gen, device=device))
        V, _ = torch.linalg.qr(torch.randn(B, N, k, generator=gen, device=device))
        s = torch.logspace(0, -6, k, device=device)
        G = (U * s) @ V.mT
    else:
        raise ValueError(f"unknown muon input variant {variant!r}")
    return {"G": G.to(torch.bfloat16).contiguous(), "steps": NUM_STEPS}


def _polar_express(G: torch.Tensor, steps: int, dtype: torch.dtype, out_dtype: torch.dtype,
                   coeffs=POLAR_EXPRESS_COEFFS, norm_dims: tuple[int, ...] = (-2, -1),
                   norm_scale: float = NORM_SCALE) -> torch.Tensor:
    """The map with its knobs exposed (``calibration.py`` builds wrong variants from them)."""
    if steps != NUM_STEPS:
        raise ValueError(f"steps must equal {NUM_STEPS} (got {steps})")
    if G.dim() != 3:
        raise ValueError(f"G must be [B, M, N] (got shape {tuple(G.shape)})")
    tall = G.shape[-2] > G.shape[-1]
    X = G.mT if tall else G
    norm_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    X = X.to(norm_dtype)
    norm = torch.linalg.vector_norm(X, dim=norm_dims, keepdim=True)
    X = (X / (norm * norm_scale + NORM_EPS)).to(dtype)
    for a, b, c in coeffs:
        A = X @ X.mT
        Bk = b * A + c * (A @ A)
        X = a * X + Bk @ X
    if tall:
        X = X.mT
    return X.to(out_dtype).contiguous()


def run(G: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Reference Muon orthogonalisation (FP16 iterate).

    Args:
        G: ``[B, M, N]`` bfloat16.
        steps: must equal 5.

    Returns:
        ``[B, M, N]`` bfloat16, a new tensor.

    Raises:
        ValueError: if ``steps != 5`` or ``G`` is not 3-D.
    """
    return _polar_express(G, steps, torch.float16, torch.bfloat16)


def oracle(G: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The same map evaluated in FP64 (normalisation and iterate), kept in FP64.

    Args/Raises: as :func:`run`. Returns ``[B, M, N]`` float64 (not rounded to BF16, so the
    measured error of a solution includes its own output rounding).
    """
    return _polar_express(G, steps, torch.float64, torch.float64)
