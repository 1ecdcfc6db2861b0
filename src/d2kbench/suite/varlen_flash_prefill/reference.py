"""Packed variable-length causal GQA attention forward (FlashAttention ``flash_attn_varlen_func``
semantics): inputs and the PyTorch reference.

The operator. ``N`` sequences are packed back to back along the token axis: sequence ``s`` owns
rows ``cu_seqlens[s] .. cu_seqlens[s+1] - 1`` of ``q``, ``k`` and ``v``. Within each sequence,
with local positions ``i`` (query) and ``j`` (key), query head ``h`` and its KV head
``g = h // G`` (``G = Hq / Hkv``)::

    s[j]       = scale * q[bos + i, h, :] . k[bos + j, g, :]      for j <= i (causal)
    lse[h, bos + i] = log(sum_{j <= i} exp(s[j]))                    (natural log, float32)
    o[bos + i, h, :] = sum_{j <= i} exp(s[j] - lse[h, bos + i]) * v[bos + j, g, :]

where ``bos = cu_seqlens[s]``. No query attends to a key of another sequence.

Length schemes (workload parameter ``lens``):

* ``ladder`` (the registered workloads): a six-level halving ladder ``LMAX, LMAX/2, ...,
  LMAX/32`` with ``N / 6`` sequences per level (log-uniform lengths over a 32x range), in a
  seeded random order. ``LMAX = 64 T / (21 N)`` follows from the axes (``T = (N / 6) LMAX
  63 / 32``), so the causal work ``sum_s L_s (L_s + 1) / 2 = (130 T^2 / (63 N) + T) / 2`` is a
  formula of the axes (the SOL counts of task.yaml) while the order, and with it every
  sequence boundary, changes with the seed.
* ``random``: ``N`` lengths drawn log-uniformly in ``[1, T]`` and rescaled to sum to ``T`` (every
  length >= 1), seeded; lengths of one token, tile-edge lengths and one dominant sequence occur.
* ``edge``: lengths at tile edges (1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, ...),
  the last sequence taking the remaining tokens; seeded order.

``run`` is the naive-but-honest baseline: per sequence (the lengths are read on the host),
float32 scores materialised one chunk of query rows at a time, exact ``logsumexp``, output
rounded once. ``oracle`` is the same computation in float64, unrounded.
"""

from __future__ import annotations

import math

import torch

#: Score elements materialised per chunk (2^28 = 1 GiB in float32), bounds the reference's memory.
CHUNK_ELEMENTS = 1 << 28
#: Factor applied to q in the ``peaky`` variant (softmax rows dominated by few keys).
PEAKY_FACTOR = 8.0
#: Levels of the ``ladder`` scheme (lengths LMAX / 2**k, k < LADDER_LEVELS).
LADDER_LEVELS = 6
#: Lengths of the ``edge`` scheme (cycled): one token, and one below, at and above tile edges.
EDGE_LENGTHS = (1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 3, 48, 80, 96, 100)


def ladder_lmax(T: int, N: int) -> int:
    """Longest length of the ``ladder`` scheme: ``64 T / (21 N)``.

    Raises:
        ValueError: ``N`` not a multiple of 6, or ``T`` not ``(N / 6) * LMAX * 63 / 32`` for an
            ``LMAX`` divisible by 32 (the ladder's lengths would not be whole numbers).
    """
    if N % LADDER_LEVELS or (64 * T) % (21 * N):
        raise ValueError(f"ladder lengths need N % 6 == 0 and 64 T divisible by 21 N (T={T}, N={N})")
    lmax = 64 * T // (21 * N)
    if lmax % 32 or (N // LADDER_LEVELS) * (lmax * 63 // 32) != T:
        raise ValueError(f"ladder lengths: LMAX={lmax} must be a multiple of 32 with T = N/6 * LMAX * 63/32")
    return lmax


def causal_pairs(lens: torch.Tensor) -> int:
    """``sum_s L_s (L_s + 1) / 2``: (query, key) pairs under the causal mask."""
    lens = lens.long()
    return int((lens * (lens + 1) // 2).sum())


def make_lengths(workload: dict, seed: int) -> torch.Tensor:
    """Sequence lengths of one call (``N = N1 - 1`` of them, int64, CPU), summing to ``T``, each >= 1, in seeded order.

    Raises:
        ValueError: an unknown scheme, ``N > T``, or axes the ``ladder`` scheme cannot meet.
    """
    T, N = int(workload["T"]), int(workload["N1"]) - 1
    kind = str(workload.get("lens", "ladder"))
    if N > T:
        raise ValueError(f"N={N} sequences cannot share T={T} tokens (each has at least one)")
    gen = torch.Generator().manual_seed(seed)
    if kind == "ladder":
        lmax = ladder_lmax(T, N)
        lens = torch.tensor([lmax >> k for k in range(LADDER_LEVELS)] * (N // LADDER_LEVELS))
    elif kind == "random":
        w = torch.exp(torch.rand(N, generator=gen, dtype=torch.float64) * math.log(T))   # log-uniform in [1, T]
        lens = 1 + torch.floor(w / w.sum() * (T - N)).long()
        short = T - int(lens.sum())                                                       # < N tokens left
        lens[torch.randperm(N, generator=gen)[:short]] += 1
    elif kind == "edge":
        lens = torch.tensor([EDGE_LENGTHS[i % len(EDGE_LENGTHS)] for i in range(N - 1)])
        rest = T - int(lens.sum())
        if rest < 1:
            raise ValueError(f"edge lengths: T={T} is too small for N={N} sequences")
        lens = torch.cat([lens, torch.tensor([rest])])
    else:
        raise ValueError(f"unknown lens scheme {kind!r} (ladder, random or edge)")
    return lens[torch.randperm(N, generator=gen)]


def make_inputs(workload: dict, seed: int, device: str | torch.device) -> dict:
    """Draw the inputs of one call.

    Args:
        workload: axes ``T, N1 (= N + 1), Hq, Hkv, D`` and optional params ``lens`` (see
            :func:`make_lengths`), ``dtype`` (``bfloat16`` by default; the CPU smoke workloads use
            ``float16``) and ``variant`` (``gaussian``; ``peaky``: q x 8).
        seed: seed of the generators (lengths on the CPU, tensors on ``device``).
        device: where the tensors are created.

    Returns:
        ``q [T, Hq, D]``, ``k``/``v [T, Hkv, D]`` (standard normal, ``dtype``), ``cu_seqlens
        [N + 1]`` int32 on ``device``, ``max_seqlen`` (host int, the longest length) and
        ``scale = 1/sqrt(D)``.

    Raises:
        ValueError: unknown parameters or inconsistent axes.
    """
    T, N1, Hq, Hkv, D = (int(workload[a]) for a in ("T", "N1", "Hq", "Hkv", "D"))
    N = N1 - 1
    if Hq % Hkv:
        raise ValueError(f"Hq={Hq} is not a multiple of Hkv={Hkv}")
    dtype = getattr(torch, str(workload.get("dtype", "bfloat16")))
    variant = workload.get("variant", "gaussian")
    if variant not in ("gaussian", "peaky"):
        raise ValueError(f"unknown varlen_flash_prefill variant {variant!r}")
    lens = make_lengths(workload, seed)
    cu = torch.zeros(N + 1, dtype=torch.int64)
    cu[1:] = torch.cumsum(lens, 0)
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)

    q = randn(T, Hq, D)
    if variant == "peaky":
        q *= PEAKY_FACTOR
    k, v = randn(T, Hkv, D), randn(T, Hkv, D)
    return {"q": q.to(dtype), "k": k.to(dtype), "v": v.to(dtype), "cu_seqlens": cu.to(torch.int32).to(device),
            "max_seqlen": int(lens.max()), "scale": 1.0 / math.sqrt(D)}


def _attention(q, k, v, cu_seqlens, scale, compute: torch.dtype, out_dtype: torch.dtype):
    T, Hq, D = q.shape
    G = Hq // k.shape[1]
    o = torch.empty((T, Hq, D), dtype=out_dtype, device=q.device)
    lse = torch.empty((Hq, T), dtype=torch.float32 if compute == torch.float32 else compute, device=q.device)
    cu = cu_seqlens.tolist()
    for s in range(len(cu) - 1):
        b0, b1 = cu[s], cu[s + 1]
        L = b1 - b0
        if L == 0:
            continue
        ks = k[b0:b1].to(compute).transpose(0, 1).repeat_interleave(G, dim=0)   # [Hq, L, D], head h -> h // G
        vs = v[b0:b1].to(compute).transpose(0, 1).repeat_interleave(G, dim=0)
        rows = max(1, min(L, CHUNK_ELEMENTS // max(1, Hq * L)))
        for r0 in range(0, L, rows):
            r1 = min(L, r0 + rows)
            qc = q[b0 + r0:b0 + r1].to(compute).transpose(0, 1)                   # [Hq, R, D]
            sc = torch.matmul(qc, ks[:, :r1].transpose(1, 2)) * scale              # [Hq, R, r1]
            i = torch.arange(r0, r1, device=q.device)[:, None]
            j = torch.arange(r1, device=q.device)[None, :]
            sc = sc.masked_fill(j > i, float("-inf"))
            lse_c = torch.logsumexp(sc, dim=-1)                                     # [Hq, R]
            p = torch.exp(sc - lse_c[..., None])
            o[b0 + r0:b0 + r1] = torch.matmul(p, vs[:, :r1]).transpose(0, 1).to(out_dtype)
            lse[:, b0 + r0:b0 + r1] = lse_c.to(lse.dtype)
    return o, lse


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
        scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference varlen causal GQA attention (float32 computation; reads the lengths on the host).

    Args:
        q: ``[T, Hq, D]`` bfloat16 (float16 on smoke workloads), packed sequences.
        k, v: ``[T, Hkv, D]``, q's dtype, ``Hq`` a multiple of ``Hkv``.
        cu_seqlens: ``[N + 1]`` int32 offsets (``cu_seqlens[0] = 0``, ``cu_seqlens[N] = T``).
        max_seqlen: the longest sequence's length (unused here: grid sizing for kernels).
        scale: softmax scale.

    Returns:
        ``(o, lse)``: ``o [T, Hq, D]`` in q's dtype; ``lse [Hq, T]`` float32, the natural log of
        each row's softmax denominator.
    """
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return _attention(q, k, v, cu_seqlens, scale, torch.float32, q.dtype)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def oracle(q, k, v, cu_seqlens, max_seqlen, scale) -> tuple[torch.Tensor, torch.Tensor]:
    """The same map in float64, unrounded: ``(o float64 [T, Hq, D], lse float64 [Hq, T])``."""
    return _attention(q, k, v, cu_seqlens, scale, torch.float64, torch.float64)
