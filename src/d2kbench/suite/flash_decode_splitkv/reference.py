"""Long-context decode attention over a contiguous per-sequence KV cache (flash-decoding):
inputs and the PyTorch reference.

The operator. Each of ``B`` sequences has one new query token with ``Hq`` heads and
``cache_seqlens[b]`` cached tokens stored in rows ``0 .. cache_seqlens[b] - 1`` of its slot of
``k_cache``/``v_cache`` ``[B, LMAX, Hkv, D]`` (the layout of FlashAttention's
``flash_attn_with_kvcache``). Query head ``h`` attends over KV head ``h // G`` (``G = Hq / Hkv``)::

    s_t        = scale * q[b, h, :] . k_cache[b, t, h // G, :]          t < cache_seqlens[b]
    lse[b, h]  = log(sum_t exp(s_t))                                    (natural log)
    o[b, h, :] = sum_t exp(s_t - lse[b, h]) * v_cache[b, t, h // G, :]

Rows at or past a sequence's length hold NaN: a kernel that touches them, even to multiply by
zero, produces NaN and fails.

``run`` is graph-capturable (no host synchronisation): per sequence it masks the whole
capacity ``LMAX`` (the lengths live on the device) and computes scores, log-sum-exp and output
in float32, rounding ``o`` once. ``oracle`` is the same in float64, unrounded.
"""

from __future__ import annotations

import math

import torch

#: Factor applied to q in the ``peaky`` variant.
PEAKY_FACTOR = 8.0
#: Lengths of the ``orders`` scheme (clipped to LMAX): contexts that differ by orders of magnitude.
ORDERS = (1, 7, 100, 1000, 10_000, 100_000, 131_072)


def halving_total(B: int, LMAX: int) -> int:
    """Total cached tokens of the ``halving`` scheme: ``LMAX * (2 - 2**(1 - B))`` (the SOL
    formula of task.yaml), exact when ``LMAX`` is a multiple of ``2**(B - 1)``."""
    return sum(LMAX >> i for i in range(B))


def make_lengths(workload: dict, seed: int) -> torch.Tensor:
    """Sequence lengths of one call (int64, CPU), in random order.

    ``halving`` (default): the ladder ``LMAX, LMAX/2, ..., LMAX/2**(B-1)`` (a batch of long
    contexts at different stages, from full capacity down to 1/2**(B-1) of it), with a random
    number of tokens moved from the longer to the shorter of each adjacent pair, so that lengths
    are not powers of two while the total stays :func:`halving_total` exactly. ``edge``: lengths
    at tile and page boundaries (1, 63, 64, 65, 1023, ...) and the capacity. ``orders``: the
    :data:`ORDERS` ladder (1 to 131072 tokens), repeated.

    Raises:
        ValueError: an unknown scheme, or ``halving`` with ``LMAX`` not a multiple of ``2**(B-1)``.
    """
    B, LMAX = int(workload["B"]), int(workload["LMAX"])
    kind = str(workload.get("lens", "halving"))
    gen = torch.Generator().manual_seed(seed)
    if kind == "halving":
        if LMAX % (1 << (B - 1)):
            raise ValueError(f"halving lengths need LMAX={LMAX} to be a multiple of 2**(B-1)")
        lens = [LMAX >> i for i in range(B)]
        for i in range(0, B - 1, 2):
            d = int(torch.randint(0, max(1, lens[i + 1] // 2), (1,), generator=gen))
            lens[i] -= d
            lens[i + 1] += d
        lens = torch.tensor(lens)
    elif kind == "edge":
        cands = [1, 2, 63, 64, 65, 1023, 1024, 1025, 4097, LMAX - 1, LMAX, LMAX // 2 + 1]
        lens = torch.tensor([min(LMAX, max(1, cands[i % len(cands)])) for i in range(B)])
    elif kind == "orders":
        lens = torch.tensor([min(LMAX, ORDERS[i % len(ORDERS)]) for i in range(B)])
    else:
        raise ValueError(f"unknown lens scheme {kind!r} (halving, edge or orders)")
    return lens[torch.randperm(B, generator=gen)]


def make_inputs(workload: dict, seed: int, device: str | torch.device) -> dict:
    """Draw the inputs of one call.

    Args:
        workload: axes ``B, Hq, Hkv, D, LMAX`` and optional params ``dtype`` (``bfloat16`` by
            default, ``float16`` on CPU smoke workloads), ``lens`` (see :func:`make_lengths`)
            and ``variant`` (``gaussian``; ``peaky``: q x 8).
        seed: seed of the generators (lengths on the CPU, tensors on ``device``).
        device: where the tensors are created.

    Returns:
        ``q [B, Hq, D]``, ``k_cache``/``v_cache [B, LMAX, Hkv, D]`` (NaN in every row at or past
        the sequence's length), ``cache_seqlens [B]`` int32 in ``[1, LMAX]``, ``scale = 1/sqrt(D)``.

    Raises:
        ValueError: unknown parameters or inconsistent axes.
    """
    B, Hq, Hkv, D, LMAX = (int(workload[a]) for a in ("B", "Hq", "Hkv", "D", "LMAX"))
    if Hq % Hkv:
        raise ValueError(f"Hq={Hq} is not a multiple of Hkv={Hkv}")
    dtype = getattr(torch, str(workload.get("dtype", "bfloat16")))
    variant = workload.get("variant", "gaussian")
    if variant not in ("gaussian", "peaky"):
        raise ValueError(f"unknown flash_decode_splitkv variant {variant!r}")
    lens = make_lengths(workload, seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    invalid = (torch.arange(LMAX)[None, :] >= lens[:, None]).to(device).view(B, LMAX, 1, 1)

    def cache() -> torch.Tensor:
        x = torch.empty((B, LMAX, Hkv, D), dtype=dtype, device=device)
        for b in range(B):  # per sequence: bounded float32 temporaries
            x[b] = torch.randn((LMAX, Hkv, D), generator=gen, device=device).masked_fill_(invalid[b], float("nan"))
        return x

    q = torch.randn((B, Hq, D), generator=gen, device=device)
    if variant == "peaky":
        q *= PEAKY_FACTOR
    k_cache, v_cache = cache(), cache()
    return {"q": q.to(dtype), "k_cache": k_cache, "v_cache": v_cache,
            "cache_seqlens": lens.to(torch.int32).to(device), "scale": 1.0 / math.sqrt(D)}


def _attend(q, k_cache, v_cache, cache_seqlens, scale, compute: torch.dtype, out_dtype: torch.dtype):
    B, Hq, D = q.shape
    _, LMAX, Hkv, _ = k_cache.shape
    G = Hq // Hkv
    o = torch.empty((B, Hq, D), dtype=out_dtype, device=q.device)
    lse = torch.empty((B, Hq), dtype=torch.float32 if compute == torch.float32 else compute, device=q.device)
    t = torch.arange(LMAX, device=q.device)
    for b in range(B):                                   # static loop: no host sync, graph-capturable
        ok = t < cache_seqlens[b]                        # [LMAX]
        k = torch.where(ok[:, None, None], k_cache[b].to(compute), 0.0)   # NaN rows dropped
        v = torch.where(ok[:, None, None], v_cache[b].to(compute), 0.0)
        qg = q[b].to(compute).view(Hkv, G, D)
        s = torch.matmul(qg, k.permute(1, 2, 0)) * scale                   # [Hkv, G, LMAX]
        s = s.masked_fill(~ok, float("-inf"))
        m = torch.logsumexp(s, dim=-1, keepdim=True)                        # [Hkv, G, 1]
        p = torch.exp(s - m)
        o[b] = torch.matmul(p, v.permute(1, 0, 2)).reshape(Hq, D).to(out_dtype)
        lse[b] = m.reshape(Hq).to(lse.dtype)
    return o, lse


def run(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
        scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference decode attention (float32 computation, no host synchronisation).

    Args:
        q: ``[B, Hq, D]`` bf16 (fp16 on smoke workloads).
        k_cache, v_cache: ``[B, LMAX, Hkv, D]``, q's dtype; NaN in rows ``>= cache_seqlens[b]``.
        cache_seqlens: ``[B]`` int32 lengths in ``[1, LMAX]`` (device).
        scale: softmax scale.

    Returns:
        ``(o, lse)``: ``o [B, Hq, D]`` in q's dtype; ``lse [B, Hq]`` float32, natural log of the
        softmax denominator of the scaled scores (new tensors).
    """
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return _attend(q, k_cache, v_cache, cache_seqlens, scale, torch.float32, q.dtype)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def oracle(q, k_cache, v_cache, cache_seqlens, scale) -> tuple[torch.Tensor, torch.Tensor]:
    """The same map in float64, unrounded: ``(o [B, Hq, D], lse [B, Hq])`` float64."""
    return _attend(q, k_cache, v_cache, cache_seqlens, scale, torch.float64, torch.float64)
