"""Top-k / top-p / temperature sampling with a caller-supplied uniform per request: inputs, the
PyTorch reference and the property check of the sampled ids.

The operator. Logits ``x [B, V]`` (float32), per request ``temperature [B]`` (> 0),
``top_k [B]`` (int32, ``1 <= k <= V``; ``k = V`` disables the filter), ``top_p [B]``
(``0 < p <= 1``; ``p = 1`` disables it) and ``uniforms [B]`` (one U[0, 1) draw per request,
made by the caller). For every row:

* ``z = x / T`` (the order of ``z`` is the order of ``x``: ``T > 0``);
* **top-k**: keep the tokens whose ``z`` is at least the k-th largest ``z`` (every token tied
  with the k-th value is kept);
* ``q = softmax(z over the kept tokens)``;
* **top-p** (vLLM semantics): keep a token iff the ``q``-mass of the tokens with a strictly
  larger ``z`` is below ``p`` (the smallest set of top tokens, whole tie groups, whose mass
  reaches ``p``; the maximum is always kept);
* **sample** by inverting the CDF of the kept tokens **in vocabulary order**: with
  ``w_i = exp(z_i - max z)`` on the kept tokens (0 elsewhere), ``M = sum w`` and
  ``C_i = sum_{j <= i} w_j``, the id is the smallest ``i`` with ``C_i > u * M`` (the last kept
  token if rounding leaves none). ``-inf`` logits have no mass and are never sampled.

The random stream is part of the contract: the same inputs give the same id, so the check is
exact up to floating-point rounding at the top-k, top-p and CDF boundaries. :func:`check`
recomputes everything in float64 and accepts an id when it is the pick under *some* resolution
of those rounding ambiguities (:data:`NEAR_TIE_REL`, :data:`MASS_TOL`). Source of the filter
semantics: vLLM ``vllm/v1/sample/ops/topk_topp_sampler.py`` (``apply_top_k_top_p``); the
inverse-CDF pick in vocabulary order is FlashInfer's ``sampling_from_probs`` rule.
"""

from __future__ import annotations

import torch

#: Two scaled logits closer than ``NEAR_TIE_REL * max(1, max |z| of the row)`` may compare
#: equal or either way in a correct FP32 kernel (``x / T`` vs ``x * (1 / T)`` vs
#: ``(x - max) * log2(e) / T`` round differently; an approximate ``exp2`` is not monotone at the
#: last bit): at the top-k and top-p boundaries such a pair may be kept or dropped together
#: or apart. 2e-6 relative is ~16 ulps of FP32.
NEAR_TIE_REL = 2e-6
#: Masses (normalised to the kept set) may be off by this much plus ``MASS_TOL_PER_Z * max |z|``
#: in a correct FP32 kernel: FP32 sums over up to 2^18 terms in tiles (~1e-6), the exponentials
#: of rounded ``z`` (relative error ~1.2e-7 |z|, so 4e-6 at |z| = 37 and 4e-5 at T = 0.05,
#: |z| = 300). A top-p boundary or a CDF boundary inside that band may fall either way.
MASS_TOL = 2e-5
MASS_TOL_PER_Z = 1e-6
#: Rows per chunk of the float64 check (bounds its memory: ~12 [rows, V] float64 temporaries).
_CHECK_ELEMS = 1 << 22


def _lm_logits(B: int, V: int, gen: torch.Generator, device) -> torch.Tensor:
    """Language-model-like logits: a Gaussian bulk (std U[1.5, 2.5] per row) plus a head of
    1-64 plausible tokens at random positions, 1-7 above the bulk's 4.5-sigma point, so that
    most of the softmax mass sits on a few to a few hundred tokens, as in a trained LM."""
    sig = 1.5 + torch.rand(B, 1, generator=gen, device=device)
    x = torch.randn(B, V, generator=gen, device=device) * sig
    nh = min(64, V)
    head = torch.randint(1, nh + 1, (B, 1), generator=gen, device=device)
    pos = torch.rand(B, V, generator=gen, device=device).argsort(dim=1)[:, :nh]
    val = sig * 4.5 + 1.0 + 6.0 * torch.rand(B, nh, generator=gen, device=device)
    val = torch.where(torch.arange(nh, device=device)[None, :] < head, val, x.gather(1, pos))
    return x.scatter(1, pos, val)


def make_inputs(workload: dict, seed: int, device: str | torch.device) -> dict:
    """Draw the inputs of one call.

    Args:
        workload: axes ``B`` (requests), ``V`` (vocabulary); params ``filters`` and ``variant``.

            ``filters`` (per request): ``"kp"`` (k in [10, 100) and p in [0.7, 0.98) on every
            row), ``"k"`` (k only, p = 1), ``"p"`` (p only, k = V), ``"mixed"`` (each row one of
            kp, k, p, or none: plain temperature sampling). Temperatures U[0.4, 1.2).

            ``variant``: ``"lm"`` (default, :func:`_lm_logits`); ``"ties"`` (logits on a grid of
            halves in [-6, 6]: large exact tie groups at the k-th value and the top-p cut);
            ``"masked"`` (LM logits with 40 % of the vocabulary at -inf, some rows with fewer
            finite tokens than k); ``"flat"`` (N(0, 1) logits: top-p sets of thousands to most
            of the vocabulary); ``"extreme"`` (per row one of: k = 1, p = 0.01, T = 0.05, T = 4,
            k = V and p = 1, k = V - 1, u at 0 or just below 1).
        seed: seed of a ``torch.Generator`` on ``device``.
        device: where the tensors are created.

    Returns:
        ``{"logits": [B, V] float32, "temperature": [B] float32, "top_k": [B] int32,
        "top_p": [B] float32, "uniforms": [B] float32}``.
    """
    B, V = int(workload["B"]), int(workload["V"])
    filters = workload.get("filters", "kp")
    variant = workload.get("variant", "lm")
    gen = torch.Generator(device=device).manual_seed(seed)
    if variant in ("lm", "masked", "extreme"):
        x = _lm_logits(B, V, gen, device)
    elif variant == "ties":
        x = torch.randint(-12, 13, (B, V), generator=gen, device=device).float() / 2.0
    elif variant == "flat":
        x = torch.randn(B, V, generator=gen, device=device)
    else:
        raise ValueError(f"unknown variant {variant!r}")
    T = 0.4 + 0.8 * torch.rand(B, generator=gen, device=device)
    k = torch.randint(10, 100, (B,), generator=gen, device=device).clamp(max=V)
    p = 0.7 + 0.28 * torch.rand(B, generator=gen, device=device)
    u = torch.rand(B, generator=gen, device=device)
    full_k, no_p = torch.full_like(k, V), torch.ones_like(p)
    if filters == "k":
        p = no_p
    elif filters == "p":
        k = full_k
    elif filters == "mixed":
        mode = torch.randint(0, 4, (B,), generator=gen, device=device)
        k = torch.where((mode == 2) | (mode == 3), full_k, k)
        p = torch.where((mode == 1) | (mode == 3), no_p, p)
    elif filters != "kp":
        raise ValueError(f"unknown filters {filters!r}")
    if variant == "masked":
        dead = torch.rand(B, V, generator=gen, device=device) < 0.4
        few = torch.rand(B, 1, generator=gen, device=device) < 0.25   # rows with at most 5 finite tokens
        keep = torch.rand(B, V, generator=gen, device=device).argsort(dim=1) < 5
        dead = torch.where(few, ~keep, dead)
        x = x.masked_fill(dead, float("-inf"))
    if variant == "extreme":
        mode = torch.arange(B, device=device) % 8
        k = torch.where(mode == 0, torch.ones_like(k), k)
        p = torch.where(mode == 1, torch.full_like(p, 0.01), p)
        T = torch.where(mode == 2, torch.full_like(T, 0.05), T)
        T = torch.where(mode == 3, torch.full_like(T, 4.0), T)
        k = torch.where(mode == 4, full_k, k)
        p = torch.where(mode == 4, no_p, p)
        k = torch.where(mode == 5, torch.full_like(k, max(1, V - 1)), k)
        p = torch.where(mode == 5, no_p, p)
        u = torch.where(mode == 6, torch.zeros_like(u), u)
        u = torch.where(mode == 7, torch.full_like(u, 1.0 - 2.0 ** -24), u)
    return {"logits": x.float().contiguous(), "temperature": T.float().contiguous(),
            "top_k": k.to(torch.int32).contiguous(), "top_p": p.float().contiguous(),
            "uniforms": u.float().contiguous()}


def run(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
        uniforms: torch.Tensor) -> torch.Tensor:
    """Reference sampler (vLLM's sort-based ``apply_top_k_top_p`` semantics, ties kept, then the
    inverse CDF in vocabulary order).

    The scaled logits and the softmax are FP32, as in vLLM; the cumulative masses are summed in
    float64 so that the reference's own rounding stays far inside the check's bands. Static
    shapes, no host synchronisation.

    Args:
        logits: ``[B, V]`` float32 (``-inf`` allowed: masked tokens).
        temperature: ``[B]`` float32, > 0.
        top_k: ``[B]`` int32 in ``[1, V]``.
        top_p: ``[B]`` float32 in ``(0, 1]``.
        uniforms: ``[B]`` float32 in ``[0, 1)``.

    Returns:
        ``ids [B]`` int64.
    """
    B, V = logits.shape
    z = logits.float() / temperature.float()[:, None]
    zs = torch.sort(z, dim=1).values                                      # ascending
    k = top_k.long().clamp(1, V)
    kth = zs.gather(1, (V - k)[:, None])
    zk = torch.where(z >= kth, z, torch.full_like(z, float("-inf")))
    q = torch.softmax(zk, dim=1).double()
    qs = torch.sort(zk, dim=1).values                                     # ascending, -inf first
    mass = torch.softmax(qs, dim=1).double()
    suffix = torch.cat([mass.flip(1).cumsum(1).flip(1), torch.zeros(B, 1, dtype=mass.dtype, device=z.device)], 1)
    above = suffix.gather(1, torch.searchsorted(qs, zk, right=True))      # mass strictly above each token
    keep = (zk > float("-inf")) & ((above < top_p.double()[:, None]) | (top_p[:, None] >= 1))
    w = torch.where(keep, q, torch.zeros_like(q))
    cum = w.cumsum(1)
    target = uniforms.double()[:, None] * cum[:, -1:]
    ids = torch.searchsorted(cum, target, right=True).clamp(max=V - 1)
    last = (V - 1) - torch.flip(keep, dims=[1]).to(torch.int8).argmax(dim=1, keepdim=True)
    ids = torch.where(ids > last, last, ids)
    return ids[:, 0].to(torch.int64).contiguous()


def _row_sets(x: torch.Tensor, T: torch.Tensor, k: torch.Tensor, p: torch.Tensor):
    """Float64 masses and the surely-kept / possibly-kept masks of a chunk of rows.

    Returns ``(e [R, V], sure [R, V], poss [R, V], tol [R])``: ``e = exp(z - max z)`` (0 for
    ``-inf``), ``sure`` the tokens every correct FP32 kernel keeps, ``poss`` those some may keep,
    ``tol`` the mass tolerance of each row (normalised)."""
    R, V = x.shape
    z = x.double() / T.double()[:, None]
    fin = torch.isfinite(z)
    zmax = z.amax(dim=1, keepdim=True)
    zscale = torch.where(fin, z.abs(), torch.zeros_like(z)).amax(dim=1, keepdim=True).clamp(min=1.0)
    delta = NEAR_TIE_REL * zscale
    tol = MASS_TOL + MASS_TOL_PER_Z * zscale[:, 0]
    e = torch.where(fin, torch.exp(z - zmax), torch.zeros_like(z))
    zs, order = torch.sort(z, dim=1)                                     # ascending
    es = e.gather(1, order)
    zero = torch.zeros(R, 1, dtype=z.dtype, device=z.device)
    suffix = torch.cat([es.flip(1).cumsum(1).flip(1), zero], 1)          # suffix[r] = mass of sorted[r:]

    def n_and_mass(pos):
        return V - pos, suffix.gather(1, pos)

    # first position > z and > z + delta; first position >= z and >= z - delta
    pos_gt, pos_gt_hi = torch.searchsorted(zs, torch.cat([z, z + delta], 1), right=True).split(V, dim=1)
    pos_ge, pos_ge_lo = torch.searchsorted(zs, torch.cat([z, z - delta], 1), right=False).split(V, dim=1)
    n_gt, m_gt = n_and_mass(pos_gt)
    n_ge, m_ge = n_and_mass(pos_ge)
    n_lo, m_lo = n_and_mass(pos_gt_hi)                                    # above z + delta: surely above
    n_wide, m_wide = n_and_mass(pos_ge_lo)
    n_hi = n_gt + (n_wide - n_ge)                                         # + the near ties below z
    m_hi = m_gt + (m_wide - m_ge)
    kk = k.long()[:, None]
    k_off = kk >= V
    sk = k_off | (n_hi < kk)
    pk = k_off | (n_lo < kk)
    z_lo = (e * sk).sum(dim=1, keepdim=True)
    z_hi = (e * pk).sum(dim=1, keepdim=True)
    pp = p.double()[:, None]
    p_off = pp >= 1
    t = tol[:, None]
    sp = p_off | (m_hi < (pp - t) * z_lo)
    ppos = p_off | (m_lo < (pp + t) * z_hi)
    pos = e > 0
    return e, sk & sp & pos, pk & ppos & pos, tol


def bad_rows(inputs: list, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``ids`` (``[B]`` integer, or ``[n, B]``: n candidate answers checked against one
    float64 recomputation), whether it fails :func:`check` and whether it lies outside the
    possibly-kept set: ``(bad, outside)``, bool tensors of the shape of ``ids``."""
    x, T, k, p, u = (inputs[i] for i in range(5))
    B, V = x.shape
    dev = x.device
    ids = ids.to(dev).to(torch.int64)
    many = ids.dim() == 2
    ids = ids if many else ids[None, :]
    bad = torch.zeros(ids.shape, dtype=torch.bool, device=dev)
    outside = torch.zeros(ids.shape, dtype=torch.bool, device=dev)
    rows = max(1, _CHECK_ELEMS // max(1, V))
    col = torch.arange(V, device=dev)[None, :]
    for r0 in range(0, B, rows):
        sl = slice(r0, min(B, r0 + rows))
        e, sure, poss, tol = _row_sets(x[sl], T[sl], k[sl], p[sl])
        uu = u[sl].double()
        for n in range(ids.shape[0]):
            j = ids[n, sl]
            in_range = (j >= 0) & (j < V)
            jj = j.clamp(0, V - 1)[:, None]
            ok_member = in_range & poss.gather(1, jj)[:, 0]
            base = sure | (col == jj)
            amb = poss & ~base
            before = col < jj
            m_b = (e * base).sum(1)
            c_b = (e * (base & before)).sum(1)
            low_a = (e * (amb & before)).sum(1)
            high_a = (e * (amb & (col > jj))).sum(1)
            g = uu * m_b - c_b
            f_lo = g - (1 - uu) * low_a
            f_hi = g + uu * high_a
            ej = e.gather(1, jj)[:, 0]
            band = tol * (m_b + low_a + high_a)
            ok_cdf = (f_hi >= -band) & (f_lo <= ej + band)
            bad[n, sl] = ~(ok_member & ok_cdf)
            outside[n, sl] = ~ok_member
        del e, sure, poss
    return (bad, outside) if many else (bad[0], outside[0])


def check(inputs: list, outputs: list) -> tuple[bool, float | None, str]:
    """Property check of ``ids``: each id is the inverse-CDF pick of its row under some resolution
    of the rounding ambiguities.

    Per row, in float64: the tokens every correct kernel keeps (``sure``) and those a correct
    kernel may keep (``poss``: near ties at the top-k value, top-p masses within the band). An
    id ``j`` passes iff ``j`` is in ``poss`` and, for some kept set ``S`` between ``sure + {j}``
    and ``poss``, ``C_{j-1}(S) <= u * M(S) < C_j(S)`` within the mass band (relaxed: ``S`` ranges
    over all such sets, so the condition is an interval test). Rows without ambiguous tokens
    (almost all) therefore admit exactly one id, or two when ``u * M`` lies within the band of a
    CDF boundary.

    Never raises on malformed outputs: returns ``(passed, number of bad rows, detail)``.
    """
    x, T, k, p, u = (inputs[i] for i in range(5))
    if len(outputs) != 1:
        return False, None, f"expected 1 output, got {len(outputs)}"
    B, V = x.shape
    ids = outputs[0]
    if not isinstance(ids, torch.Tensor) or tuple(ids.shape) != (B,):
        return False, None, f"ids shape {list(getattr(ids, 'shape', []))}; expected [{B}]"
    bad, outside = bad_rows(inputs, ids)
    n_bad = int(bad.sum())
    if not n_bad:
        return True, 0.0, ""
    r = int(bad.nonzero()[0])
    what = "outside the kept set (top-k / top-p / -inf)" if bool(outside[r]) else \
        "not the inverse-CDF pick of u in vocabulary order"
    detail = (f"{n_bad} of {B} rows sampled a wrong id ({int(outside.sum())} outside the kept set); first: row {r}, "
              f"id {int(ids[r])} is {what} (T {float(T[r]):.4g}, k {int(k[r])}, p {float(p[r]):.4g}, "
              f"u {float(u[r]):.6g})")
    return False, float(n_bad), detail


def kept_probabilities(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                       top_p: torch.Tensor) -> torch.Tensor:
    """The exact sampling distribution of every row in float64 (``[B, V]``, rows sum to 1): the
    renormalised, filtered softmax of the specification (its surely-kept set). Used by the
    distribution tests of the task's test file."""
    e, sure, _, _ = _row_sets(logits, temperature, top_k, top_p)
    w = e * sure
    return w / w.sum(dim=1, keepdim=True)
