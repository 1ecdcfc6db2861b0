"""Causal GQA attention forward (FlashAttention ``flash_attn_func`` semantics): inputs and the
PyTorch reference.

The operator. For batch ``b``, query head ``h`` (its KV head is ``g = h // G`` with
``G = Hq / Hkv``) and query row ``i``::

    s[j]        = scale * q[b, i, h, :] . k[b, j, g, :]        for j <= i (causal)
    lse[b, h, i] = log(sum_{j <= i} exp(s[j]))                   (natural log, float32)
    o[b, i, h, :] = sum_{j <= i} exp(s[j] - lse[b, h, i]) * v[b, j, g, :]

``q`` is ``[B, S, Hq, D]``, ``k`` and ``v`` are ``[B, S, Hkv, D]`` (BSHD, contiguous), ``o`` has
``q``'s shape and dtype, ``lse`` is ``[B, Hq, S]`` float32.

``run`` is the naive-but-honest baseline: inputs upcast to float32, scores materialised one
chunk of query rows at a time (keys beyond the chunk's last row are skipped), exact
``logsumexp``, output rounded to the input dtype once. ``oracle`` is the same computation in
float64 (unrounded), the target of the per-row tolerance in ``task.yaml``.
"""

from __future__ import annotations

import math

import torch

#: Score elements materialised per chunk (2^28 = 1 GiB in float32), bounds the reference's memory.
CHUNK_ELEMENTS = 1 << 28
#: Factor applied to q in the ``peaky`` variant (softmax rows dominated by few keys).
PEAKY_FACTOR = 8.0


def make_inputs(workload: dict, seed: int, device: str | torch.device) -> dict:
    """Draw the inputs of one call.

    Args:
        workload: axes ``B, S, Hq, Hkv, D`` and optional params ``dtype`` (``bfloat16``
            by default; the CPU smoke workloads use ``float16``) and ``variant``
            (``gaussian`` by default; ``peaky`` multiplies q by 8).
        seed: seed of a ``torch.Generator`` on ``device``.
        device: where the tensors are created.

    Returns:
        ``{"q": [B, S, Hq, D], "k": [B, S, Hkv, D], "v": [B, S, Hkv, D], "scale": 1/sqrt(D)}``,
        tensors contiguous in ``dtype`` with standard-normal entries.
    """
    B, S, Hq, Hkv, D = (int(workload[a]) for a in ("B", "S", "Hq", "Hkv", "D"))
    if Hq % Hkv:
        raise ValueError(f"Hq={Hq} is not a multiple of Hkv={Hkv}")
    dtype = getattr(torch, str(workload.get("dtype", "bfloat16")))
    variant = workload.get("variant", "gaussian")
    if variant not in ("gaussian", "peaky"):
        raise ValueError(f"unknown gqa_flash_prefill variant {variant!r}")
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)

    q = randn(B, S, Hq, D)
    if variant == "peaky":
        q *= PEAKY_FACTOR
    k = randn(B, S, Hkv, D)
    v = randn(B, S, Hkv, D)
    return {"q": q.to(dtype), "k": k.to(dtype), "v": v.to(dtype), "scale": 1.0 / math.sqrt(D)}


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
               compute: torch.dtype, out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    B, S, Hq, D = q.shape
    Hkv = k.shape[2]
    G = Hq // Hkv
    o = torch.empty((B, S, Hq, D), dtype=out_dtype, device=q.device)
    lse = torch.empty((B, Hq, S), dtype=compute, device=q.device)
    rows = max(1, min(S, CHUNK_ELEMENTS // max(1, Hq * S)))
    for b in range(B):
        kb = k[b].to(compute).transpose(0, 1).repeat_interleave(G, dim=0)  # [Hq, S, D], head h -> h // G
        vb = v[b].to(compute).transpose(0, 1).repeat_interleave(G, dim=0)
        for r0 in range(0, S, rows):
            r1 = min(S, r0 + rows)
            qc = q[b, r0:r1].to(compute).transpose(0, 1)                  # [Hq, R, D]
            s = torch.matmul(qc, kb[:, :r1].transpose(1, 2)) * scale       # [Hq, R, r1]
            i = torch.arange(r0, r1, device=q.device)[:, None]
            j = torch.arange(r1, device=q.device)[None, :]
            s = s.masked_fill(j > i, float("-inf"))
            lse_c = torch.logsumexp(s, dim=-1)                             # [Hq, R]
            p = torch.exp(s - lse_c[..., None])
            o[b, r0:r1] = torch.matmul(p, vb[:, :r1]).transpose(0, 1).to(out_dtype)
            lse[b, :, r0:r1] = lse_c
    return o, lse


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference causal GQA attention (float32 computation).

    Args:
        q: ``[B, S, Hq, D]`` bfloat16 (float16 on smoke workloads), contiguous.
        k, v: ``[B, S, Hkv, D]``, same dtype, ``Hq`` a multiple of ``Hkv``.
        scale: softmax scale (``1/sqrt(D)``).

    Returns:
        ``(o, lse)``: ``o`` ``[B, S, Hq, D]`` in q's dtype; ``lse`` ``[B, Hq, S]`` float32
        (natural log of the softmax denominator of each row).
    """
    with _no_tf32():
        return _attention(q, k, v, scale, torch.float32, q.dtype)


def oracle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The same map in float64, unrounded: ``(o float64 [B, S, Hq, D], lse float64 [B, Hq, S])``."""
    return _attention(q, k, v, scale, torch.float64, torch.float64)


class _no_tf32:
    """Context manager: float32 matmuls in full float32 (no TF32) while the reference runs."""

    def __enter__(self):
        self.prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        return self

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32 = self.prev
        return False
