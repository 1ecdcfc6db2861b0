"""Causal GQA attention backward (FlashAttention ``flash_attn_func`` backward semantics): inputs
and the PyTorch reference.

The operator. The forward is, for batch ``b``, query head ``h`` (its KV head is ``g = h // G``,
``G = Hq / Hkv``) and query row ``i``::

    s[i, j]      = scale * q[b, i, h, :] . k[b, j, g, :]          for j <= i (causal)
    lse[b, h, i] = log(sum_{j <= i} exp(s[i, j]))                  (natural log, float32)
    o[b, i, h, :] = sum_{j <= i} exp(s[i, j] - lse[b, h, i]) * v[b, j, g, :]

Given the forward's saved state (``q, k, v, o, lse``) and the output gradient ``do``, the
backward is::

    P[i, j]    = exp(s[i, j] - lse[b, h, i])   (j <= i; 0 above the diagonal)
    delta[i]   = sum_d do[b, i, h, d] * o[b, i, h, d]
    dP[i, j]   = do[b, i, h, :] . v[b, j, g, :]
    dS[i, j]   = P[i, j] * (dP[i, j] - delta[i])
    dq[b, i, h, :] = scale * sum_j dS[i, j] * k[b, j, g, :]
    dk[b, j, g, :] = scale * sum_{h in group g} sum_i dS[i, j] * q[b, i, h, :]
    dv[b, j, g, :] = sum_{h in group g} sum_i P[i, j] * do[b, i, h, :]

(``delta[i] = sum_j P[i, j] dP[i, j]`` when ``o`` and ``lse`` are exactly the forward's; the
backward uses the given ``o`` and ``lse`` as they are, as FlashAttention's does.)

``make_inputs`` draws q, k, v and do and computes ``o`` and ``lse`` with the float32 forward
below (trusted, in the harness's parent), so every solution starts from the same saved state.
``run`` is the naive-but-honest baseline in float32: scores materialised one chunk of query
rows at a time (keys beyond the chunk's last row skipped), gradients rounded to the input dtype
once. ``oracle`` is the same computation in float64 (unrounded).
"""

from __future__ import annotations

import math

import torch

#: Score elements materialised per chunk (2^27: 512 MiB per float32 tensor, four of them live).
CHUNK_ELEMENTS = 1 << 27
#: Variants of ``make_inputs``: ``gaussian`` (all rows of do drawn), ``zero_rows`` (the do rows
#: of whole token spans are zero, as for padding or prompt tokens whose loss is masked).
VARIANTS = ("gaussian", "zero_rows")
#: Fraction of the tokens whose do rows are zero in the ``zero_rows`` variant (about).
ZERO_FRACTION = 0.3


def zero_row_mask(S: int, seed: int) -> torch.Tensor:
    """``[S]`` bool, True at the tokens whose output gradient is zero (``zero_rows`` variant):
    spans of 1-40 tokens at random places, about :data:`ZERO_FRACTION` of the sequence, always
    including the first and the last token (the first row has one key; the last tile is ragged)."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.zeros(S, dtype=torch.bool)
    t = 0
    while t < S:
        keep = int(torch.randint(1, 80, (1,), generator=gen))
        drop = int(torch.randint(1, 40, (1,), generator=gen))
        t += keep
        mask[t:t + drop] = True
        t += drop
    mask[0] = True
    mask[-1] = True
    return mask


def make_inputs(workload: dict, seed: int, device: str | torch.device) -> dict:
    """Draw the inputs of one call (the forward's saved state and the output gradient).

    Args:
        workload: axes ``B, S, Hq, Hkv, D`` and optional params ``dtype`` (``bfloat16`` by
            default; the CPU smoke workloads use ``float16``) and ``variant`` (:data:`VARIANTS`).
        seed: seed of a ``torch.Generator`` on ``device`` (and of the CPU span draw).
        device: where the tensors are created.

    Returns:
        ``{"q": [B, S, Hq, D], "k": [B, S, Hkv, D], "v": [B, S, Hkv, D], "o": [B, S, Hq, D],
        "lse": [B, Hq, S] float32, "do": [B, S, Hq, D], "scale": 1/sqrt(D)}``: q, k, v and do
        standard normal in ``dtype``; o (rounded to ``dtype``) and lse from :func:`forward`.

    Raises:
        ValueError: ``Hq`` not a multiple of ``Hkv``, or an unknown variant.
    """
    B, S, Hq, Hkv, D = (int(workload[a]) for a in ("B", "S", "Hq", "Hkv", "D"))
    if Hq % Hkv:
        raise ValueError(f"Hq={Hq} is not a multiple of Hkv={Hkv}")
    dtype = getattr(torch, str(workload.get("dtype", "bfloat16")))
    variant = str(workload.get("variant", "gaussian"))
    if variant not in VARIANTS:
        raise ValueError(f"unknown flash_attn_backward variant {variant!r} ({', '.join(VARIANTS)})")
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    q, k, v = randn(B, S, Hq, D), randn(B, S, Hkv, D), randn(B, S, Hkv, D)
    do = randn(B, S, Hq, D)
    if variant == "zero_rows":
        for b in range(B):
            do[b, zero_row_mask(S, (seed * 7 + b) % (1 << 63)).to(device)] = 0
    scale = 1.0 / math.sqrt(D)
    o, lse = forward(q, k, v, scale)
    return {"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do, "scale": scale}


def _rows_per_chunk(S: int, Hq: int) -> int:
    return max(1, min(S, CHUNK_ELEMENTS // max(1, Hq * S)))


def _scores(qc: torch.Tensor, kb: torch.Tensor, r0: int, scale: float) -> torch.Tensor:
    """Scaled causal scores of query rows ``r0 .. r0 + R`` against keys ``0 .. r0 + R``:
    ``[Hq, R, r0 + R]``, -inf above the diagonal."""
    R = qc.shape[1]
    s = torch.matmul(qc, kb[:, :r0 + R].transpose(1, 2)).mul_(scale)
    i = torch.arange(r0, r0 + R, device=qc.device)[:, None]
    j = torch.arange(r0 + R, device=qc.device)[None, :]
    return s.masked_fill_(j > i, float("-inf"))


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The float32 forward that produces the saved state: ``(o [B, S, Hq, D] in q's dtype,
    lse [B, Hq, S] float32)`` (natural log). Trusted; TF32 off."""
    B, S, Hq, D = q.shape
    G = Hq // k.shape[2]
    o = torch.empty_like(q)
    lse = torch.empty((B, Hq, S), dtype=torch.float32, device=q.device)
    rows = _rows_per_chunk(S, Hq)
    with _no_tf32():
        for b in range(B):
            kb = k[b].float().transpose(0, 1).repeat_interleave(G, dim=0)      # [Hq, S, D]: head h -> h // G
            vb = v[b].float().transpose(0, 1).repeat_interleave(G, dim=0)
            for r0 in range(0, S, rows):
                r1 = min(S, r0 + rows)
                s = _scores(q[b, r0:r1].float().transpose(0, 1), kb, r0, scale)
                lse_c = torch.logsumexp(s, dim=-1)                             # [Hq, R]
                p = s.sub_(lse_c[..., None]).exp_()
                o[b, r0:r1] = torch.matmul(p, vb[:, :r1]).transpose(0, 1).to(q.dtype)
                lse[b, :, r0:r1] = lse_c
    return o, lse


def _backward(q, k, v, o, lse, do, scale, compute: torch.dtype):
    """dq, dk, dv in ``compute`` precision (unrounded), chunked over query rows."""
    B, S, Hq, D = q.shape
    Hkv = k.shape[2]
    G = Hq // Hkv
    dev = q.device
    dq = torch.empty((B, S, Hq, D), dtype=compute, device=dev)
    dk = torch.zeros((B, S, Hkv, D), dtype=compute, device=dev)
    dv = torch.zeros((B, S, Hkv, D), dtype=compute, device=dev)
    rows = _rows_per_chunk(S, Hq)
    for b in range(B):
        kb = k[b].to(compute).transpose(0, 1).repeat_interleave(G, dim=0)      # [Hq, S, D]
        vb = v[b].to(compute).transpose(0, 1).repeat_interleave(G, dim=0)
        dkb = torch.zeros((Hq, S, D), dtype=compute, device=dev)               # per query head
        dvb = torch.zeros((Hq, S, D), dtype=compute, device=dev)
        for r0 in range(0, S, rows):
            r1 = min(S, r0 + rows)
            qc = q[b, r0:r1].to(compute).transpose(0, 1)                      # [Hq, R, D]
            doc = do[b, r0:r1].to(compute).transpose(0, 1)
            oc = o[b, r0:r1].to(compute).transpose(0, 1)
            p = _scores(qc, kb, r0, scale).sub_(lse[b, :, r0:r1].to(compute)[..., None]).exp_()   # [Hq, R, r1]
            delta = (doc * oc).sum(dim=-1)                                     # [Hq, R]
            dvb[:, :r1] += torch.matmul(p.transpose(1, 2), doc)
            ds = torch.matmul(doc, vb[:, :r1].transpose(1, 2)).sub_(delta[..., None]).mul_(p)
            dq[b, r0:r1] = torch.matmul(ds, kb[:, :r1]).mul_(scale).transpose(0, 1)
            dkb[:, :r1] += torch.matmul(ds.transpose(1, 2), qc).mul_(scale)
        dk[b] = dkb.view(Hkv, G, S, D).sum(dim=1).transpose(0, 1)            # the group sum
        dv[b] = dvb.view(Hkv, G, S, D).sum(dim=1).transpose(0, 1)
    return dq, dk, dv


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
        do: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference causal GQA attention backward (float32 computation, TF32 off).

    Args:
        q: ``[B, S, Hq, D]`` bfloat16 (float16 on smoke workloads), contiguous.
        k, v: ``[B, S, Hkv, D]``, same dtype, ``Hq`` a multiple of ``Hkv``.
        o: ``[B, S, Hq, D]``, the forward's output, same dtype.
        lse: ``[B, Hq, S]`` float32, the forward's natural-log softmax denominators.
        do: ``[B, S, Hq, D]``, the gradient of the loss with respect to ``o``, same dtype.
        scale: softmax scale (``1/sqrt(D)``).

    Returns:
        ``(dq [B, S, Hq, D], dk [B, S, Hkv, D], dv [B, S, Hkv, D])`` in q's dtype, contiguous.
    """
    with _no_tf32():
        dq, dk, dv = _backward(q, k, v, o, lse, do, scale, torch.float32)
    return dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype)


def oracle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
           do: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same map in float64, unrounded: ``(dq, dk, dv)`` float64, shapes as :func:`run`."""
    return _backward(q, k, v, o, lse, do, scale, torch.float64)


class _no_tf32:
    """Context manager: float32 matmuls in full float32 (no TF32) while the reference runs."""

    def __enter__(self):
        self.prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        return self

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32 = self.prev
        return False
