"""Chunked prefill over a paged KV cache (vLLM / SGLang "extend" attention) with the cache write:
inputs and the PyTorch reference.

The operator. ``N`` requests each add ``q_i`` new tokens after ``ctx_i`` tokens already in the
paged cache. The new tokens are packed back to back (``cu_seqlens_q``). New token ``r`` of
request ``i`` (absolute position ``ctx_i + r``), query head ``h`` and its KV head ``g = h // G``
(``G = Hq / Hkv``) attend to every cached token of the request and to the new tokens
``0 .. r`` of its own chunk::

    keys_i   = [k_cache at positions 0 .. ctx_i - 1 (through block_tables[i])] ++ k_new[chunk i]
    s[j]     = scale * q[bos_i + r, h, :] . keys_i[j, g, :]          for j <= ctx_i + r
    o[bos_i + r, h, :] = sum_j softmax_j(s) * values_i[j, g, :]

Cached position ``t`` of request ``i`` lives at page ``block_tables[i, t // BS]``, slot
``t % BS`` of ``k_cache``/``v_cache [NB, BS, Hkv, D]`` (NHD pages). The new tokens' keys and
values are also written into the cache, in place: ``k_cache.view(NB * BS, Hkv, D)[slot_mapping[t]]
= k_new[t]`` (a bit copy; likewise v), where ``slot_mapping`` names the slots of positions
``ctx_i .. ctx_i + q_i - 1``. Every other byte of the caches stays as it was.

Poison. Every cache slot that holds no context token is NaN before the call: unused pages, the
tail of each request's last page, and the new tokens' own slots (a kernel that reads the new
keys back from the cache before they are written, or reads a context past ``ctx_i``, gets NaN).
Block-table entries past a request's pages point at unused (NaN) pages.

Length schemes (workload parameter ``lens``):

* ``mixed`` (the registered workloads): ``NP = (T - N) / (QMAX - 1)`` prefill chunks of
  ``QMAX`` new tokens and ``ND = N - NP`` decode requests of one new token, in a seeded random
  order. The prefill contexts come in antithetic pairs ``CMAX/2 +- d`` with the first pair
  ``(0, CMAX)`` (a pure prefill with an empty prefix and the longest context are in every
  batch), ``d`` uniform in ``[0, CMAX/2]``; the decode contexts in pairs ``CMAX/16 +- d``, ``d``
  uniform in ``[0, CMAX/16 - 1]``. The totals are therefore fixed by the axes (the SOL
  formulas of task.yaml are exact) while every length, and so every page boundary, changes
  with the seed; contexts end mid-page.
* ``edge``: chunk lengths and contexts cycle through tile and page edges (1, 2, BS - 1, BS,
  BS + 1, ...; contexts 0, 1, BS - 1, BS, BS + 1, ...), the last request taking the tokens left.

``run`` computes in float32 from the bf16 inputs (host reads of the lengths: it is trusted
code), rounds the output once, and writes the cache copy; ``oracle`` is the same in float64.
"""

from __future__ import annotations

import math

import torch

#: Score elements materialised per chunk of query rows (2^28 = 1 GiB in float32).
CHUNK_ELEMENTS = 1 << 28
#: Factor applied to q in the ``peaky`` variant (softmax rows dominated by few keys).
PEAKY_FACTOR = 8.0
#: Chunk lengths of the ``edge`` scheme (cycled; capped at QMAX).
EDGE_Q = (1, 2, 15, 16, 17, 31, 33, 64, 65, 1, 7, 1, 129, 3)


def edge_contexts(BS: int) -> tuple[int, ...]:
    """Contexts of the ``edge`` scheme (cycled; capped at CMAX): empty, one token, page edges, and
    the longest (the last entry, capped to CMAX)."""
    return (0, 1, BS - 1, BS, BS + 1, 2 * BS - 1, 0, 3 * BS + 5, 2 * BS, 5 * BS + 1, 7, 4 * BS - 1, 1 << 30)


def mix_counts(T: int, N: int, QMAX: int) -> tuple[int, int]:
    """``(NP, ND)`` of the ``mixed`` scheme: prefill chunks of QMAX tokens and one-token decodes
    with ``NP * QMAX + ND = T`` and ``NP + ND = N``.

    Raises:
        ValueError: the axes admit no such split, or NP or ND is odd (antithetic pairs).
    """
    if QMAX == 1:
        np_ = 0
    elif (T - N) % (QMAX - 1) or T < N:
        raise ValueError(f"mixed lengths: T - N = {T - N} is not a multiple of QMAX - 1 = {QMAX - 1}")
    else:
        np_ = (T - N) // (QMAX - 1)
    nd = N - np_
    if np_ % 2 or nd % 2 or nd < 0 or (QMAX == 1 and T != N):
        raise ValueError(f"mixed lengths need even counts of prefill chunks ({np_}) and decodes ({nd})")
    return np_, nd


def make_lengths(workload: dict, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q_lens [N], context_lens [N])`` int64 on the CPU, in seeded request order.

    Raises:
        ValueError: an unknown scheme or axes the scheme cannot meet.
    """
    T, N, QMAX, CMAX, BS = (int(workload[a]) for a in ("T", "N", "QMAX", "CMAX", "BS"))
    kind = str(workload.get("lens", "mixed"))
    gen = torch.Generator().manual_seed(seed)
    if kind == "mixed":
        np_, nd = mix_counts(T, N, QMAX)
        if CMAX % 16:
            raise ValueError(f"mixed lengths need CMAX divisible by 16 (CMAX={CMAX})")
        half, dec = CMAX // 2, CMAX // 16
        d = torch.randint(0, half + 1, (max(0, np_ // 2 - 1),), generator=gen)
        pre = torch.cat([torch.tensor([0, CMAX] if np_ else [], dtype=torch.int64), half - d, half + d])
        dd = torch.randint(0, dec, (nd // 2,), generator=gen)
        ctx = torch.cat([pre, dec - dd, dec + dd])
        ql = torch.cat([torch.full((np_,), QMAX, dtype=torch.int64), torch.ones(nd, dtype=torch.int64)])
    elif kind == "edge":
        ql = torch.tensor([min(QMAX, EDGE_Q[i % len(EDGE_Q)]) for i in range(N - 1)], dtype=torch.int64)
        rest = T - int(ql.sum())
        if not 1 <= rest <= QMAX:
            raise ValueError(f"edge lengths: the last request would get {rest} tokens (T={T}, N={N}, QMAX={QMAX})")
        ql = torch.cat([ql, torch.tensor([rest])])
        cyc = edge_contexts(BS)
        ctx = torch.tensor([min(CMAX, cyc[i % len(cyc)]) for i in range(N)], dtype=torch.int64)
    else:
        raise ValueError(f"unknown lens scheme {kind!r} (mixed or edge)")
    perm = torch.randperm(N, generator=gen)
    return ql[perm], ctx[perm]


def make_metadata(workload: dict, seed: int) -> dict:
    """The CPU part of :func:`make_inputs`: lengths, pages and slots (int64 tensors).

    Returns:
        ``q_lens [N]``, ``context_lens [N]``, ``cu_seqlens_q [N + 1]``, ``block_tables [N, MAXB]``
        (a random page permutation; entries past a request's pages point at unused pages),
        ``slot_mapping [T]`` (the slots of positions ``ctx_i .. ctx_i + q_i - 1``) and
        ``valid [NB * BS]`` (bool: the slot holds a context token).

    Raises:
        ValueError: a page pool or table too small (one unused page is required).
    """
    T, N, NB, BS, MAXB = (int(workload[a]) for a in ("T", "N", "NB", "BS", "MAXB"))
    ql, ctx = make_lengths(workload, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    total = ctx + ql
    pages = (total + BS - 1) // BS
    if int(pages.max()) > MAXB:
        raise ValueError(f"block table too narrow: {int(pages.max())} pages needed, MAXB={MAXB}")
    if int(pages.sum()) >= NB:
        raise ValueError(f"page pool too small: {int(pages.sum())} pages needed, NB={NB} (one unused page is required)")
    perm = torch.randperm(NB, generator=gen)
    used, unused = perm[:int(pages.sum())], perm[int(pages.sum()):]
    table = unused[torch.randint(0, unused.numel(), (N, MAXB), generator=gen)]
    valid = torch.zeros(NB * BS, dtype=torch.bool)
    slots, start = [], 0
    for i in range(N):
        n = int(pages[i])
        table[i, :n] = used[start:start + n]
        start += n
        t = torch.arange(int(total[i]))
        flat = table[i, t // BS] * BS + t % BS
        valid[flat[:int(ctx[i])]] = True
        slots.append(flat[int(ctx[i]):])
    cu = torch.zeros(N + 1, dtype=torch.int64)
    cu[1:] = torch.cumsum(ql, 0)
    if int(cu[-1]) != T:
        raise ValueError(f"lengths sum to {int(cu[-1])}, not T={T}")
    return {"q_lens": ql, "context_lens": ctx, "cu_seqlens_q": cu, "block_tables": table,
            "slot_mapping": torch.cat(slots), "valid": valid}


def make_inputs(workload: dict, seed: int, device: str | torch.device) -> dict:
    """Draw the inputs of one call.

    Args:
        workload: axes ``T, N, Hq, Hkv, D, NB, BS, MAXB, QMAX, CMAX`` and optional params
            ``lens`` (``mixed`` default, ``edge``; :func:`make_lengths`), ``dtype``
            (``bfloat16`` default; ``float16`` on the CPU smoke workloads) and ``variant``
            (``gaussian``; ``peaky``: q x 8).
        seed: seed of the generators (metadata on the CPU, tensors on ``device``).
        device: where the tensors are created.

    Returns:
        ``q [T, Hq, D]``, ``k_new``/``v_new [T, Hkv, D]`` (standard normal), ``cu_seqlens_q
        [N + 1]`` int32, ``k_cache``/``v_cache [NB, BS, Hkv, D]`` (standard normal at context
        slots, NaN everywhere else, the new tokens' slots included), ``block_tables [N, MAXB]``
        int32, ``context_lens [N]`` int32, ``slot_mapping [T]`` int64, ``max_seqlen_q = QMAX``
        and ``max_context_len = CMAX`` (host ints, upper bounds of the lengths), ``scale =
        1/sqrt(D)``.

    Raises:
        ValueError: unknown parameters or inconsistent axes.
    """
    T, N, Hq, Hkv, D, NB, BS = (int(workload[a]) for a in ("T", "N", "Hq", "Hkv", "D", "NB", "BS"))
    if Hq % Hkv:
        raise ValueError(f"Hq={Hq} is not a multiple of Hkv={Hkv}")
    dtype = getattr(torch, str(workload.get("dtype", "bfloat16")))
    variant = workload.get("variant", "gaussian")
    if variant not in ("gaussian", "peaky"):
        raise ValueError(f"unknown chunked_prefill_paged variant {variant!r}")
    meta = make_metadata(workload, seed)
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)

    q = randn(T, Hq, D)
    if variant == "peaky":
        q *= PEAKY_FACTOR
    invalid = (~meta["valid"]).to(device).view(NB, BS, 1, 1)
    k_cache = randn(NB, BS, Hkv, D).masked_fill_(invalid, float("nan")).to(dtype)
    v_cache = randn(NB, BS, Hkv, D).masked_fill_(invalid, float("nan")).to(dtype)
    return {
        "q": q.to(dtype), "k_new": randn(T, Hkv, D).to(dtype), "v_new": randn(T, Hkv, D).to(dtype),
        "cu_seqlens_q": meta["cu_seqlens_q"].to(torch.int32).to(device),
        "k_cache": k_cache, "v_cache": v_cache,
        "block_tables": meta["block_tables"].to(torch.int32).to(device),
        "context_lens": meta["context_lens"].to(torch.int32).to(device),
        "slot_mapping": meta["slot_mapping"].to(torch.int64).to(device),
        "max_seqlen_q": int(workload["QMAX"]), "max_context_len": int(workload["CMAX"]),
        "scale": 1.0 / math.sqrt(D),
    }


def write_cache(k_new: torch.Tensor, v_new: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                slot_mapping: torch.Tensor) -> None:
    """``cache.view(NB * BS, Hkv, D)[slot_mapping[t]] = new[t]`` for K and V (bit copies, in place)."""
    NB, BS, Hkv, D = k_cache.shape
    k_cache.view(NB * BS, Hkv, D).index_copy_(0, slot_mapping, k_new)
    v_cache.view(NB * BS, Hkv, D).index_copy_(0, slot_mapping, v_new)


def _extend(q, k_new, v_new, cu_seqlens_q, k_cache, v_cache, block_tables, context_lens, scale,
            compute: torch.dtype, out_dtype: torch.dtype) -> torch.Tensor:
    T, Hq, D = q.shape
    NB, BS, Hkv, _ = k_cache.shape
    G = Hq // Hkv
    o = torch.empty((T, Hq, D), dtype=out_dtype, device=q.device)
    cu, ctxs = cu_seqlens_q.tolist(), context_lens.tolist()
    for i, ctx in enumerate(ctxs):
        b0, b1 = cu[i], cu[i + 1]
        n = b1 - b0
        if n == 0:
            continue
        pages = block_tables[i, :(ctx + BS - 1) // BS].long()
        kc = k_cache[pages].reshape(-1, Hkv, D)[:ctx]
        vc = v_cache[pages].reshape(-1, Hkv, D)[:ctx]
        ks = torch.cat([kc, k_new[b0:b1]]).to(compute).transpose(0, 1).repeat_interleave(G, dim=0)  # [Hq, L, D]
        vs = torch.cat([vc, v_new[b0:b1]]).to(compute).transpose(0, 1).repeat_interleave(G, dim=0)
        L = ctx + n
        rows = max(1, min(n, CHUNK_ELEMENTS // max(1, Hq * L)))
        for r0 in range(0, n, rows):
            r1 = min(n, r0 + rows)
            kk = ctx + r1                                             # keys any row of the chunk sees
            qc = q[b0 + r0:b0 + r1].to(compute).transpose(0, 1)       # [Hq, R, D]
            s = torch.matmul(qc, ks[:, :kk].transpose(1, 2)) * scale  # [Hq, R, kk]
            r = torch.arange(r0, r1, device=q.device)[:, None]
            j = torch.arange(kk, device=q.device)[None, :]
            s = s.masked_fill(j > ctx + r, float("-inf"))
            p = torch.softmax(s, dim=-1)
            o[b0 + r0:b0 + r1] = torch.matmul(p, vs[:, :kk]).transpose(0, 1).to(out_dtype)
    return o


def run(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, cu_seqlens_q: torch.Tensor,
        k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
        slot_mapping: torch.Tensor, max_seqlen_q: int, max_context_len: int, scale: float) -> torch.Tensor:
    """Reference extend attention with the cache write (float32 computation; reads the lengths
    on the host).

    Args:
        q: ``[T, Hq, D]`` bf16 (fp16 on smoke workloads), the new tokens packed by ``cu_seqlens_q``.
        k_new, v_new: ``[T, Hkv, D]``, q's dtype: the new tokens' keys and values.
        cu_seqlens_q: ``[N + 1]`` int32 offsets of the chunks.
        k_cache, v_cache: ``[NB, BS, Hkv, D]`` NHD pages, updated in place at ``slot_mapping``.
        block_tables: ``[N, MAXB]`` int32 page ids (positions ``0 .. ctx_i + q_i - 1``).
        context_lens: ``[N]`` int32 cached tokens per request (0 allowed).
        slot_mapping: ``[T]`` int64 ``page * BS + offset`` of every new token.
        max_seqlen_q, max_context_len: host upper bounds of the chunk and context lengths (unused here).
        scale: softmax scale.

    Returns:
        ``o [T, Hq, D]`` in q's dtype.
    """
    write_cache(k_new, v_new, k_cache, v_cache, slot_mapping)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return _extend(q, k_new, v_new, cu_seqlens_q, k_cache, v_cache, block_tables, context_lens, scale,
                       torch.float32, q.dtype)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def oracle(q, k_new, v_new, cu_seqlens_q, k_cache, v_cache, block_tables, context_lens, slot_mapping,
           max_seqlen_q, max_context_len, scale) -> torch.Tensor:
    """The same attention in float64, unrounded (reads the context from the caches as given,
    without writing them): ``o [T, Hq, D]`` float64."""
    return _extend(q, k_new, v_new, cu_seqlens_q, k_cache, v_cache, block_tables, context_lens, scale,
                   torch.float64, torch.float64)
