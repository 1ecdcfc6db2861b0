"""Shared-prefix (cascade) decode over a paged KV cache: inputs and the PyTorch reference.

The operator. ``N`` decode requests (one query token each, ``Hq`` heads) whose contexts start
with the same ``common_prefix_len = P`` tokens (a system prompt, the prompt of parallel samples
or beams) followed by each request's own suffix. The cache is a pool of pages (vLLM NHD layout
``[NB, BS, Hkv, D]``): token ``t`` of request ``i`` is at page ``block_tables[i, t // BS]``, slot
``t % BS``. The first ``P // BS`` table entries are the same physical pages in every row; when
``P`` is not a multiple of ``BS``, the page holding the prefix's last ``P % BS`` tokens is each
request's own page, whose first ``P % BS`` slots hold the same keys and values in every request.
Query head ``h`` reads KV head ``h // G`` (``G = Hq / Hkv``). The output is plain attention of
each request over its whole context (prefix and suffix)::

    s_t        = scale * q[i, h, :] . k_cache[page(i, t), t % BS, h // G, :]    t < seq_lens[i]
    o[i, h, :] = sum_t softmax_t(s) * v_cache[page(i, t), t % BS, h // G, :]

``seq_lens[i] = P + suffix_i`` with ``suffix_i >= 0`` (an empty suffix is allowed). Every slot
that holds no valid token is NaN, and table entries past a request's last page point at
NaN-filled pages.

``run`` does not exploit the prefix: per group of requests it gathers the pages up to the
table's capacity ``MAXB * BS``, zeroes invalid tokens and computes float32 attention (no host
synchronisation: graph-capturable). ``oracle`` is the same in float64, unrounded.
"""

from __future__ import annotations

import math

import torch

#: Gathered elements per group of requests (bounds the reference's memory).
CHUNK_ELEMENTS = 1 << 28
#: Factor applied to q in the ``peaky`` variant.
PEAKY_FACTOR = 8.0


def suffix_capacity(workload: dict) -> int:
    """Most suffix tokens a request can hold: ``MAXB * BS - P``."""
    return int(workload["MAXB"]) * int(workload["BS"]) - int(workload["P"])


def _suffix_lengths(N: int, hi: int, BS: int, P: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    """Suffix lengths (int64, CPU) in random order. ``uniform``: antithetic pairs from
    U{hi//4 .. hi}, so the total is exactly ``N * (hi//4 + hi) / 2`` for even N (the SOL formula
    uses it); ``edge``: empty suffixes and lengths that end at page boundaries (given where the
    prefix ends in its page) and the capacity ``hi``."""
    lo = max(1, hi // 4)
    if kind == "uniform":
        half = torch.randint(lo, hi + 1, ((N + 1) // 2,), generator=gen)
        lens = torch.cat([half, lo + hi - half])[:N]
    elif kind == "edge":
        r = BS - P % BS                                       # suffix tokens that fill the prefix's last page
        cands = [0, 1, r - 1, r, r + 1, r + BS, r + BS + 1, 0, hi - 1, hi, hi // 2 + 1, 2]
        lens = torch.tensor([min(hi, max(0 if P else 1, c)) for c in (cands[i % len(cands)] for i in range(N))])
    else:
        raise ValueError(f"unknown lens kind {kind!r} (uniform or edge)")
    return lens[torch.randperm(N, generator=gen)]


def make_metadata(workload: dict, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The CPU part of :func:`make_inputs`.

    Returns:
        ``(seq_lens [N], block_tables [N, MAXB], valid [NB * BS], dst [n], src [n])`` (int64, int64,
        bool, int64, int64): lengths ``P + suffix``; tables whose first ``P // BS`` entries are
        one set of shared pages, followed by each request's own pages drawn from a random
        permutation, then ids of unused (NaN) pages; which pool slots hold a valid token; and the
        slot pairs (destination, source) that give every request's private page the prefix
        tokens of request 0's, when ``P`` does not end on a page boundary.

    Raises:
        ValueError: a page pool too small for the drawn lengths (one unused page is required),
            or a table too short.
    """
    N, NB, BS, MAXB, P = (int(workload[a]) for a in ("N", "NB", "BS", "MAXB", "P"))
    gen = torch.Generator().manual_seed(seed)
    lens = P + _suffix_lengths(N, suffix_capacity(workload), BS, P, str(workload.get("lens", "uniform")), gen)
    shared = P // BS
    need = (lens + BS - 1) // BS
    if int(need.max()) > MAXB:
        raise ValueError(f"MAXB={MAXB} is too short for {int(need.max())} pages")
    total = shared + int((need - shared).sum())
    if total >= NB:
        raise ValueError(f"page pool too small: {total} pages needed, NB={NB} (one unused page is required)")
    perm = torch.randperm(NB, generator=gen)
    table = perm[total:][torch.randint(0, NB - total, (N, MAXB), generator=gen)]      # padding -> NaN pages
    table[:, :shared] = perm[:shared]
    start = shared
    for i in range(N):
        n = int(need[i]) - shared
        table[i, shared:shared + n] = perm[start:start + n]
        start += n
    t = torch.arange(MAXB * BS)
    flat = table[:, t // BS] * BS + (t % BS)[None, :]
    valid = torch.zeros(NB * BS, dtype=torch.bool)
    valid[flat[t[None, :] < lens[:, None]]] = True
    part = torch.arange(shared * BS, P)                       # prefix tokens in a private page
    dst, src = flat[1:, part].reshape(-1), flat[:1, part].expand(N - 1, -1).reshape(-1)
    return lens, table, valid, dst, src


def make_inputs(workload: dict, seed: int, device: str | torch.device) -> dict:
    """Draw the inputs of one call.

    Args:
        workload: axes ``N, Hq, Hkv, D, NB, BS, MAXB, P`` and optional params ``dtype``
            (``bfloat16`` by default, ``float16`` on CPU smoke workloads), ``lens`` (``uniform``
            by default, ``edge``) and ``variant`` (``gaussian``, ``peaky``: q x 8).
        seed: seed of the generators (metadata on the CPU, tensors on ``device``).
        device: where the tensors are created.

    Returns:
        ``q [N, Hq, D]``, ``k_cache``/``v_cache [NB, BS, Hkv, D]`` (NaN in every slot that holds no
        valid token), ``block_tables [N, MAXB]`` int32, ``seq_lens [N]`` int32 (``>= P``),
        ``common_prefix_len = P``, ``scale = 1/sqrt(D)``.

    Raises:
        ValueError: unknown parameters, inconsistent axes or a pool too small.
    """
    N, Hq, Hkv, D, NB, BS = (int(workload[a]) for a in ("N", "Hq", "Hkv", "D", "NB", "BS"))
    if Hq % Hkv:
        raise ValueError(f"Hq={Hq} is not a multiple of Hkv={Hkv}")
    dtype = getattr(torch, str(workload.get("dtype", "bfloat16")))
    variant = workload.get("variant", "gaussian")
    if variant not in ("gaussian", "peaky"):
        raise ValueError(f"unknown cascade_prefix_decode variant {variant!r}")
    lens, table, valid, dst, src = make_metadata(workload, seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    invalid = (~valid).to(device)[:, None, None]
    dst, src = dst.to(device), src.to(device)

    def cache() -> torch.Tensor:
        x = torch.randn((NB * BS, Hkv, D), generator=gen, device=device)
        x[dst] = x[src]                                       # the prefix is the same in every request
        return x.masked_fill_(invalid, float("nan")).to(dtype).view(NB, BS, Hkv, D)

    q = torch.randn((N, Hq, D), generator=gen, device=device)
    if variant == "peaky":
        q *= PEAKY_FACTOR
    k_cache, v_cache = cache(), cache()
    return {"q": q.to(dtype), "k_cache": k_cache, "v_cache": v_cache,
            "block_tables": table.to(torch.int32).to(device), "seq_lens": lens.to(torch.int32).to(device),
            "common_prefix_len": int(workload["P"]), "scale": 1.0 / math.sqrt(D)}


def _attend(q, k_cache, v_cache, block_tables, seq_lens, scale, compute: torch.dtype, out_dtype: torch.dtype):
    N, Hq, D = q.shape
    _, BS, Hkv, _ = k_cache.shape
    L = block_tables.shape[1] * BS
    o = torch.empty((N, Hq, D), dtype=out_dtype, device=q.device)
    t = torch.arange(L, device=q.device)
    group = max(1, min(N, CHUNK_ELEMENTS // max(1, L * Hkv * D)))
    for i0 in range(0, N, group):                              # static loop: graph-capturable
        i1 = min(N, i0 + group)
        pages = block_tables[i0:i1].long()                     # [n, MAXB]
        ok = (t[None, :] < seq_lens[i0:i1, None])[:, :, None, None]                  # [n, L, 1, 1]
        k = torch.where(ok, k_cache[pages].flatten(1, 2).to(compute), 0.0)          # [n, L, Hkv, D]
        v = torch.where(ok, v_cache[pages].flatten(1, 2).to(compute), 0.0)
        s = torch.matmul(q[i0:i1].to(compute).view(i1 - i0, Hkv, Hq // Hkv, D), k.permute(0, 2, 3, 1)) * scale
        s = s.masked_fill(~ok[:, None, None, :, 0, 0], float("-inf"))                # [n, Hkv, G, L]
        o[i0:i1] = torch.matmul(torch.softmax(s, dim=-1), v.transpose(1, 2)).reshape(i1 - i0, Hq, D).to(out_dtype)
    return o


def run(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
        seq_lens: torch.Tensor, common_prefix_len: int, scale: float) -> torch.Tensor:
    """Reference decode over the full contexts (float32, no host synchronisation; the shared
    prefix is not exploited).

    Args:
        q: ``[N, Hq, D]`` bf16 (fp16 on smoke workloads).
        k_cache, v_cache: ``[NB, BS, Hkv, D]``, q's dtype, NHD pages; NaN in unused slots.
        block_tables: ``[N, MAXB]`` int32 page ids (device); the first ``P // BS`` columns agree.
        seq_lens: ``[N]`` int32 context lengths ``P + suffix`` (device).
        common_prefix_len: ``P``, the tokens every context starts with (host int).
        scale: softmax scale.

    Returns:
        ``o [N, Hq, D]`` in q's dtype (a new tensor).
    """
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return _attend(q, k_cache, v_cache, block_tables, seq_lens, scale, torch.float32, q.dtype)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def oracle(q, k_cache, v_cache, block_tables, seq_lens, common_prefix_len, scale) -> torch.Tensor:
    """The same map in float64, unrounded: ``o [N, Hq, D]`` float64."""
    return _attend(q, k_cache, v_cache, block_tables, seq_lens, scale, torch.float64, torch.float64)
