"""Sliding-window causal GQA attention forward with optional attention sinks and logit
soft-capping (Mistral / Gemma-2 / Gemma-3 local layers, gpt-oss sliding layers): inputs and the
PyTorch reference.

The operator. For batch ``b``, query head ``h`` (its KV head is ``g = h // G``, ``G = Hq / Hkv``),
query position ``i`` and window ``W`` (keys ``i - W < j <= i``: W keys including the query's
own, FlashAttention's ``window_size = (W - 1, 0)``)::

    x[j]          = scale * q[b, i, h, :] . k[b, j, g, :]
    s[j]          = softcap * tanh(x[j] / softcap)   if softcap > 0, else x[j]
    lse[b, h, i]  = log(exp(sinks[h]) + sum_{i-W<j<=i} exp(s[j]))          (natural log)
    o[b, i, h, :] = sum_{i-W<j<=i} exp(s[j] - lse[b, h, i]) * v[b, j, g, :]

``sinks[h]`` is a per-head logit that joins the softmax denominator without a value (gpt-oss);
``-inf`` means no sink (it contributes ``exp(-inf) = 0``). Soft-capping (Gemma-2) applies before
the mask.

``run`` is the naive-but-honest baseline: inputs upcast to float32, scores materialised for one
chunk of query rows at a time over the keys of the chunk's band only, exact ``logsumexp`` with
the sink as an extra column, output rounded once. ``oracle`` is the same in float64.
"""

from __future__ import annotations

import math

import torch

#: Query rows per chunk of the reference (scores of Hq x rows x (rows + W) elements).
CHUNK_ROWS = 1024
#: Factor applied to q in the ``peaky`` variant.
PEAKY_FACTOR = 8.0


def band_pairs(S: int, W: int) -> int:
    """(query, key) pairs per (batch, head) inside the causal window: ``w (w + 1) / 2 + (S - w) w``
    with ``w = min(W, S)`` (the SOL formula of task.yaml)."""
    w = min(W, S)
    return w * (w + 1) // 2 + (S - w) * w


def make_inputs(workload: dict, seed: int, device: str | torch.device) -> dict:
    """Draw the inputs of one call.

    Args:
        workload: axes ``B, S, Hq, Hkv, D, W`` and optional params: ``dtype`` (``bfloat16`` by
            default, ``float16`` on CPU smoke workloads); ``sinks`` (bool: per-head sink logits
            drawn uniformly in [0, 8], distinct per head; else all ``-inf``); ``softcap`` (float,
            0 = none); ``query_scale`` (the softmax scale is ``query_scale ** -0.5``, Gemma's
            ``query_pre_attn_scalar``; default ``D``); ``logit_std`` (q and k drawn with the
            standard deviation that gives scaled scores ``x`` this standard deviation; default:
            standard normal q and k); ``variant`` (``gaussian``; ``peaky``: q x 8).
        seed: seed of a ``torch.Generator`` on ``device``.
        device: where the tensors are created.

    Returns:
        ``q [B, S, Hq, D]``, ``k``/``v [B, S, Hkv, D]`` in ``dtype``, ``sinks [Hq]`` float32,
        ``scale`` (float), ``window`` (= W) and ``softcap`` (float).

    Raises:
        ValueError: unknown parameters or inconsistent axes.
    """
    B, S, Hq, Hkv, D, W = (int(workload[a]) for a in ("B", "S", "Hq", "Hkv", "D", "W"))
    if Hq % Hkv:
        raise ValueError(f"Hq={Hq} is not a multiple of Hkv={Hkv}")
    dtype = getattr(torch, str(workload.get("dtype", "bfloat16")))
    variant = workload.get("variant", "gaussian")
    if variant not in ("gaussian", "peaky"):
        raise ValueError(f"unknown sliding_window_prefill variant {variant!r}")
    softcap = float(workload.get("softcap", 0.0))
    scale = float(workload.get("query_scale", D)) ** -0.5
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)

    std = 1.0
    if "logit_std" in workload:   # x = scale q.k has std  std_q std_k sqrt(D) scale
        std = math.sqrt(float(workload["logit_std"]) / (math.sqrt(D) * scale))
    q = randn(B, S, Hq, D) * std
    if variant == "peaky":
        q *= PEAKY_FACTOR
    k = randn(B, S, Hkv, D) * std
    v = randn(B, S, Hkv, D)
    if workload.get("sinks", False):
        sinks = torch.rand(Hq, generator=gen, device=device, dtype=torch.float32) * 8.0
    else:
        sinks = torch.full((Hq,), float("-inf"), device=device, dtype=torch.float32)
    return {"q": q.to(dtype), "k": k.to(dtype), "v": v.to(dtype), "sinks": sinks, "scale": scale,
            "window": W, "softcap": softcap}


def _attention(q, k, v, sinks, scale, window, softcap, compute: torch.dtype, out_dtype: torch.dtype):
    B, S, Hq, D = q.shape
    G = Hq // k.shape[2]
    o = torch.empty((B, S, Hq, D), dtype=out_dtype, device=q.device)
    lse = torch.empty((B, Hq, S), dtype=torch.float32 if compute == torch.float32 else compute, device=q.device)
    sink_col = sinks.to(compute).view(Hq, 1, 1)
    for b in range(B):
        kb = k[b].to(compute).transpose(0, 1).repeat_interleave(G, dim=0)   # [Hq, S, D], head h -> h // G
        vb = v[b].to(compute).transpose(0, 1).repeat_interleave(G, dim=0)
        for r0 in range(0, S, CHUNK_ROWS):
            r1 = min(S, r0 + CHUNK_ROWS)
            k0 = max(0, r0 - window + 1)                                      # first key of the chunk's band
            qc = q[b, r0:r1].to(compute).transpose(0, 1)                      # [Hq, R, D]
            x = torch.matmul(qc, kb[:, k0:r1].transpose(1, 2)) * scale         # [Hq, R, r1 - k0]
            if softcap > 0:
                x = softcap * torch.tanh(x / softcap)
            i = torch.arange(r0, r1, device=q.device)[:, None]
            j = torch.arange(k0, r1, device=q.device)[None, :]
            x = x.masked_fill((j > i) | (j <= i - window), float("-inf"))
            lse_c = torch.logsumexp(torch.cat([x, sink_col.expand(Hq, r1 - r0, 1)], dim=-1), dim=-1)   # [Hq, R]
            p = torch.exp(x - lse_c[..., None])
            o[b, r0:r1] = torch.matmul(p, vb[:, k0:r1]).transpose(0, 1).to(out_dtype)
            lse[b, :, r0:r1] = lse_c.to(lse.dtype)
    return o, lse


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor, scale: float, window: int,
        softcap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference sliding-window attention (float32 computation).

    Args:
        q: ``[B, S, Hq, D]`` bfloat16 (float16 on smoke workloads), contiguous BSHD.
        k, v: ``[B, S, Hkv, D]``, q's dtype, ``Hq`` a multiple of ``Hkv``.
        sinks: ``[Hq]`` float32 sink logits (``-inf``: no sink).
        scale: softmax scale; window: W >= 1 keys per query (its own included); softcap: logit cap
            (0: none).

    Returns:
        ``(o, lse)``: ``o [B, S, Hq, D]`` in q's dtype; ``lse [B, Hq, S]`` float32 (natural log of
        each row's softmax denominator, sink included).
    """
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return _attention(q, k, v, sinks, scale, window, softcap, torch.float32, q.dtype)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def oracle(q, k, v, sinks, scale, window, softcap) -> tuple[torch.Tensor, torch.Tensor]:
    """The same map in float64, unrounded: ``(o [B, S, Hq, D], lse [B, Hq, S])`` float64."""
    return _attention(q, k, v, sinks, scale, window, softcap, torch.float64, torch.float64)
