"""Paged-KV GQA decode attention (vLLM v1 / FlashAttention paged layout): inputs and the
PyTorch reference.

The operator. Each of ``B`` sequences has one new query token with ``Hq`` heads and
``seq_lens[b]`` cached tokens. The cache is a shared pool of pages: token ``t`` of sequence
``b`` lives at page ``block_tables[b, t // BS]``, slot ``t % BS`` of
``k_cache``/``v_cache`` ``[NB, BS, Hkv, D]`` (NHD pages). Query head ``h`` attends over KV head
``h // G`` (``G = Hq / Hkv``)::

    s_t       = scale * q[b, h, :] . k_cache[page(b, t), t % BS, h // G, :]    t < seq_lens[b]
    o[b, h, :] = sum_t softmax_t(s) * v_cache[page(b, t), t % BS, h // G, :]

Every cache slot that holds no valid token (unused pages, the tail of each sequence's last
page) contains NaN, and block-table entries past a sequence's last page point at such pages:
a kernel that touches them, even to multiply by zero, produces NaN and fails.

``run`` is graph-capturable (no host synchronisation): it gathers every sequence's pages up
to the table's capacity ``MAXB * BS`` through advanced indexing, zeroes the invalid tokens,
and computes the attention in float32 (masked scores, exact softmax), rounding the output
once. ``oracle`` is the same in float64, unrounded.
"""

from __future__ import annotations

import math

import torch

#: Gathered elements per chunk of sequences (bounds the reference's memory).
CHUNK_ELEMENTS = 1 << 28
#: Factor applied to q in the ``peaky`` variant.
PEAKY_FACTOR = 8.0


def _lengths(B: int, hi: int, BS: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    """Sequence lengths (int64, CPU). ``uniform``: antithetic pairs from U{hi//4 .. hi}, so the
    total is exactly ``B * (hi//4 + hi) / 2`` for even B (the SOL formula uses it) while each
    length is uniform; ``edge``: lengths at page boundaries (1, BS-1, BS, BS+1, ...) and the
    capacity ``hi``, in random order."""
    lo = max(1, hi // 4)
    if kind == "uniform":
        half = torch.randint(lo, hi + 1, ((B + 1) // 2,), generator=gen)
        lens = torch.cat([half, lo + hi - half])[:B]
    elif kind == "edge":
        cands = [1, 2, BS - 1, BS, BS + 1, 2 * BS - 1, 2 * BS, 2 * BS + 1, hi - 1, hi, hi // 2 + 1]
        cands = [min(hi, max(1, c)) for c in cands]
        lens = torch.tensor([cands[i % len(cands)] for i in range(B)])
    else:
        raise ValueError(f"unknown lens kind {kind!r} (uniform or edge)")
    return lens[torch.randperm(B, generator=gen)]


def make_inputs(workload: dict, seed: int, device: str | torch.device) -> dict:
    """Draw the inputs of one call.

    Args:
        workload: axes ``B, Hq, Hkv, D, NB, BS, MAXB`` and optional params ``dtype``
            (``bfloat16`` by default, ``float16`` on CPU smoke workloads), ``lens``
            (``uniform`` by default, ``edge``) and ``variant`` (``gaussian``, ``peaky``: q x 8).
        seed: seed of the generators (metadata on the CPU, tensors on ``device``).
        device: where the tensors are created.

    Returns:
        ``q [B, Hq, D]``, ``k_cache``/``v_cache [NB, BS, Hkv, D]`` (NaN in every slot that holds
        no valid token), ``block_tables [B, MAXB]`` int32 (a random page permutation; entries
        past a sequence's pages point at unused, NaN-filled pages), ``seq_lens [B]`` int32 in
        ``[1, MAXB * BS]``, ``scale = 1/sqrt(D)``.

    Raises:
        ValueError: unknown parameters, or a page pool too small for the drawn lengths.
    """
    B, Hq, Hkv, D, NB, BS, MAXB = (int(workload[a]) for a in ("B", "Hq", "Hkv", "D", "NB", "BS", "MAXB"))
    if Hq % Hkv:
        raise ValueError(f"Hq={Hq} is not a multiple of Hkv={Hkv}")
    dtype = getattr(torch, str(workload.get("dtype", "bfloat16")))
    variant = workload.get("variant", "gaussian")
    if variant not in ("gaussian", "peaky"):
        raise ValueError(f"unknown paged_decode_gqa variant {variant!r}")
    lens, table, valid = make_metadata(workload, seed)

    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)

    q = randn(B, Hq, D)
    if variant == "peaky":
        q *= PEAKY_FACTOR
    invalid = (~valid).to(device).view(NB, BS, 1, 1)
    k_cache = randn(NB, BS, Hkv, D).masked_fill_(invalid, float("nan")).to(dtype)
    v_cache = randn(NB, BS, Hkv, D).masked_fill_(invalid, float("nan")).to(dtype)
    return {
        "q": q.to(dtype), "k_cache": k_cache, "v_cache": v_cache,
        "block_tables": table.to(torch.int32).to(device), "seq_lens": lens.to(torch.int32).to(device),
        "scale": 1.0 / math.sqrt(D),
    }


def make_metadata(workload: dict, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The CPU part of :func:`make_inputs`: ``(seq_lens [B], block_tables [B, MAXB], valid [NB * BS])``
    (int64, int64, bool): lengths, a random page permutation with NaN-page padding, and which
    pool slots hold a valid token.

    Raises:
        ValueError: a page pool too small for the drawn lengths (one unused page is required).
    """
    B, NB, BS, MAXB = (int(workload[a]) for a in ("B", "NB", "BS", "MAXB"))
    cpu = torch.Generator().manual_seed(seed)
    lens = _lengths(B, MAXB * BS, BS, str(workload.get("lens", "uniform")), cpu)
    pages_needed = (lens + BS - 1) // BS
    total = int(pages_needed.sum())
    if total >= NB:
        raise ValueError(f"page pool too small: {total} pages needed, NB={NB} (one unused page is required)")
    perm = torch.randperm(NB, generator=cpu)
    used, unused = perm[:total], perm[total:]
    table = unused[torch.randint(0, unused.numel(), (B, MAXB), generator=cpu)]  # padding -> NaN pages
    start = 0
    for b in range(B):
        n = int(pages_needed[b])
        table[b, :n] = used[start:start + n]
        start += n
    # valid slots of the pool: slot s of the j-th page of sequence b iff j * BS + s < lens[b]
    t = torch.arange(MAXB * BS)
    tok_ok = t[None, :] < lens[:, None]
    flat_slot = table[:, t // BS] * BS + (t % BS)[None, :]
    valid = torch.zeros(NB * BS, dtype=torch.bool)
    valid[flat_slot[tok_ok]] = True
    return lens, table, valid


def _decode(q, k_cache, v_cache, block_tables, seq_lens, scale, compute: torch.dtype, out_dtype: torch.dtype):
    B, Hq, D = q.shape
    NB, BS, Hkv, _ = k_cache.shape
    G = Hq // Hkv
    L = block_tables.shape[1] * BS                     # capacity of a table row
    o = torch.empty((B, Hq, D), dtype=out_dtype, device=q.device)
    t = torch.arange(L, device=q.device)
    chunk = max(1, min(B, CHUNK_ELEMENTS // max(1, L * Hkv * D)))
    for b0 in range(0, B, chunk):                       # static loop: no host sync, graph-capturable
        b1 = min(B, b0 + chunk)
        pages = block_tables[b0:b1][:, t // BS].long()  # [b, L]
        slots = (t % BS)[None, :].expand_as(pages)
        ok = t[None, :] < seq_lens[b0:b1, None]         # [b, L]
        k = k_cache[pages, slots].to(compute)           # [b, L, Hkv, D]
        v = v_cache[pages, slots].to(compute)
        k = torch.where(ok[:, :, None, None], k, 0.0)   # invalid slots hold NaN: drop them
        v = torch.where(ok[:, :, None, None], v, 0.0)
        qg = q[b0:b1].to(compute).view(b1 - b0, Hkv, G, D)
        s = torch.matmul(qg, k.permute(0, 2, 3, 1)) * scale            # [b, Hkv, G, L]
        s = s.masked_fill(~ok[:, None, None, :], float("-inf"))
        p = torch.softmax(s, dim=-1)
        o[b0:b1] = torch.matmul(p, v.permute(0, 2, 1, 3)).reshape(b1 - b0, Hq, D).to(out_dtype)
    return o


def run(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
        seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Reference paged GQA decode (float32 computation, no host synchronisation).

    Args:
        q: ``[B, Hq, D]`` bf16 (fp16 on smoke workloads).
        k_cache, v_cache: ``[NB, BS, Hkv, D]``, q's dtype, NHD pages; NaN in unused slots.
        block_tables: ``[B, MAXB]`` int32 page ids (device).
        seq_lens: ``[B]`` int32 lengths in ``[1, MAXB * BS]`` (device).
        scale: softmax scale.

    Returns:
        ``o [B, Hq, D]`` in q's dtype (a new tensor).
    """
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return _decode(q, k_cache, v_cache, block_tables, seq_lens, scale, torch.float32, q.dtype)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def oracle(q, k_cache, v_cache, block_tables, seq_lens, scale) -> torch.Tensor:
    """The same map in float64, unrounded: ``o [B, Hq, D]`` float64."""
    return _decode(q, k_cache, v_cache, block_tables, seq_lens, scale, torch.float64, torch.float64)
