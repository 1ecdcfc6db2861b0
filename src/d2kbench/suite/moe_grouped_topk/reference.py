"""MoE grouped top-k routing with a score-correction bias (DeepSeek-V3 / Kimi-K2 "noaux_tc"):
inputs, PyTorch reference and the property check of its non-unique outputs.

The operator. Router logits ``L [T, E]`` (float32) and a per-expert correction bias
``b [E]`` (float32). Experts are split into ``G`` groups of ``E / G`` consecutive experts.
For every token (row) ``t``:

* ``s = sigmoid(L[t])``: the routing scores (FP32);
* ``c = s + b``: the *choice* scores; the bias decides which experts win, never the weights;
* group score ``gs[g] = sum of the two largest c inside group g``; the ``topk_group`` groups with
  the largest ``gs`` survive, every expert of the other groups is out (masked to ``-inf``: a
  choice score can be negative, so masking to 0 would let a dropped group win);
* ``topk_ids[t]`` = the ``k`` surviving experts with the largest ``c`` (any order in the row);
* ``topk_weights[t, j] = routed_scaling_factor * s[id_j] / sum_j' s[id_j']`` (the unbiased
  scores of the chosen experts, renormalised to sum 1, then scaled).

``G = 1`` (Kimi-K2) is plain top-k over all experts. Ties: the reference resolves exact ties
toward the lower group / expert index (as a packed score-index key or a first-index argmax
does); where two groups or two experts tie (exactly, or within :data:`TIE_TOL` of each other)
the check accepts either choice, and the order of the k entries of a row is free. Hence
:func:`check`: it accepts every output that is the exact answer under *some* resolution of the
ties, and checks the weights of the ids the candidate chose.
Source of the semantics: vLLM ``grouped_topk`` (``fused_moe/router/grouped_topk_router.py``),
DeepSeek-V3 ``inference/model.py`` (``Gate.forward``).
"""

from __future__ import annotations

import torch

#: Two choice scores closer than this (absolute; |c| < 3 here) count as a tie: a solution's
#: FP32 sigmoid may differ from the FP64 one by a few ulps (1e-7 each at 1.0).
TIE_TOL = 4e-6
#: Weights: |w - w_expected| <= WEIGHT_ATOL + WEIGHT_RTOL * |w_expected| (FP32 sigmoid, sum, divide).
WEIGHT_RTOL = 1e-5
WEIGHT_ATOL = 1e-6


def make_inputs(workload: dict, seed: int, device: str | torch.device) -> dict:
    """Draw the inputs of one call.

    Args:
        workload: axes ``T`` (tokens), ``E`` (experts), ``G`` (expert groups), ``k`` (experts per
            token); params ``topk_group`` (surviving groups), ``scale`` (routed_scaling_factor)
            and ``variant``:

            * ``"normal"`` (default): logits ~ N(0, 1.5^2), bias ~ N(0, 0.05^2) (a trained
              correction bias is small next to the spread of the scores);
            * ``"ties"``: logits on a coarse grid (multiples of 1/4 in [-2, 2]) and bias 0:
              many exact ties between experts and between group scores;
            * ``"negative"``: bias ~ -1.5 + N(0, 0.05^2): every choice score is negative, so a
              kernel that masks dropped groups to 0 instead of -inf picks dropped experts;
            * ``"bias_flip"``: bias ~ N(0, 1): the bias reorders the experts far more than the
              scores do, so a kernel that ignores it, or weights with the biased scores, fails.
        seed: seed of a ``torch.Generator`` on ``device``.
        device: where the tensors are created.

    Returns:
        ``{"router_logits": [T, E] float32, "e_score_correction_bias": [E] float32, "top_k": k,
        "num_expert_group": G, "topk_group": int, "routed_scaling_factor": float}``.
    """
    T, E, G, k = (int(workload[a]) for a in ("T", "E", "G", "k"))
    if E % G:
        raise ValueError(f"E={E} is not a multiple of G={G}")
    variant = workload.get("variant", "normal")
    gen = torch.Generator(device=device).manual_seed(seed)
    logits = 1.5 * torch.randn(T, E, generator=gen, device=device)
    bias = 0.05 * torch.randn(E, generator=gen, device=device)
    if variant == "ties":
        logits = (torch.randint(-8, 9, (T, E), generator=gen, device=device) / 4.0).float()
        bias = torch.zeros(E, device=device)
    elif variant == "negative":
        bias = bias - 1.5
    elif variant == "bias_flip":
        bias = torch.randn(E, generator=gen, device=device)
    elif variant != "normal":
        raise ValueError(f"unknown variant {variant!r}")
    return {"router_logits": logits.float().contiguous(), "e_score_correction_bias": bias.float().contiguous(),
            "top_k": k, "num_expert_group": G, "topk_group": int(workload.get("topk_group", G)),
            "routed_scaling_factor": float(workload.get("scale", 1.0))}


def _top_lowest(v: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest entries of each row of ``v``, exact ties to the lower index
    (a stable descending sort; ``torch.topk`` leaves the order of ties unspecified)."""
    return torch.sort(v, dim=-1, descending=True, stable=True).indices[:, :k]


def run(router_logits: torch.Tensor, e_score_correction_bias: torch.Tensor, top_k: int,
        num_expert_group: int, topk_group: int, routed_scaling_factor: float):
    """Reference grouped top-k (vLLM's native ``grouped_topk`` with a correction bias).

    Static shapes, no host synchronisation (capturable in a CUDA graph).

    Args:
        router_logits: ``[T, E]`` float32.
        e_score_correction_bias: ``[E]`` float32.
        top_k: experts per token ``k``.
        num_expert_group: groups ``G`` (``E % G == 0``).
        topk_group: groups that survive (``1 <= topk_group <= G``).
        routed_scaling_factor: multiplies the renormalised weights.

    Returns:
        ``(topk_weights [T, k] float32, topk_ids [T, k] int32)``.
    """
    T, E = router_logits.shape
    scores = router_logits.float().sigmoid()
    choice = scores + e_score_correction_bias.float()[None, :]
    if num_expert_group > 1:
        grouped = choice.view(T, num_expert_group, E // num_expert_group)
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
        keep = _top_lowest(group_scores, topk_group)
        mask = torch.zeros(T, num_expert_group, dtype=torch.bool, device=choice.device).scatter_(1, keep, True)
        mask = mask[:, :, None].expand(T, num_expert_group, E // num_expert_group).reshape(T, E)
        choice = choice.masked_fill(~mask, float("-inf"))
    ids = _top_lowest(choice, top_k)
    w = scores.gather(1, ids)
    w = w / w.sum(dim=-1, keepdim=True) * routed_scaling_factor
    return w.float().contiguous(), ids.to(torch.int32).contiguous()


OUTPUTS = ("topk_weights", "topk_ids")


def _scores64(logits: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = torch.sigmoid(logits.to(torch.float64))
    return s, s + bias.to(torch.float64)[None, :]


def check(inputs: list, outputs: list, output: str | None = None) -> tuple[bool, float | None, str]:
    """Property check of ``topk_ids`` and ``topk_weights`` (one of them, or both when ``output``
    is None). Scores are recomputed in FP64 from the inputs.

    ``topk_ids`` (per row): ids in ``[0, E)`` and distinct; the groups they fall in are among
    the ``topk_group`` best group scores up to ties (:data:`TIE_TOL`, twice that for a group
    score); and there is a valid set ``S`` of surviving groups (all groups strictly inside the
    top, the rest filled from the tied ones) containing them such that every chosen expert's
    choice score is >= every unchosen expert's of ``S`` minus :data:`TIE_TOL`. This accepts
    exactly the outputs that are correct under some resolution of the ties.

    ``topk_weights``: at each position, the renormalised and scaled unbiased score of the id
    the candidate put there (rtol :data:`WEIGHT_RTOL`, atol :data:`WEIGHT_ATOL`).

    Never raises on malformed outputs: returns ``(passed, number of bad rows, detail)``.
    """
    logits, bias, k, G, topk_group, rsf = inputs[0], inputs[1], int(inputs[2]), int(inputs[3]), int(inputs[4]), float(inputs[5])
    if len(outputs) != 2:
        return False, None, f"expected 2 outputs, got {len(outputs)}"
    names = OUTPUTS if output is None else (output,)
    dev = logits.device
    T, E = logits.shape
    w, ids = (o.to(dev) for o in outputs)
    if tuple(ids.shape) != (T, k) or tuple(w.shape) != (T, k):
        return False, None, f"shapes {list(w.shape)}, {list(ids.shape)}; expected [{T}, {k}]"
    s, c = _scores64(logits, bias)
    ids64 = ids.to(torch.int64)
    in_range = ((ids64 >= 0) & (ids64 < E)).all(dim=1)
    safe = ids64.clamp(0, E - 1)
    problems, bad_rows = [], torch.zeros(T, dtype=torch.bool, device=dev)
    if "topk_ids" in names:
        srt = safe.sort(dim=1).values
        distinct = (srt[:, 1:] != srt[:, :-1]).all(dim=1) if k > 1 else torch.ones(T, dtype=torch.bool, device=dev)
        ok = in_range & distinct
        if int((~ok).sum()):
            problems.append(f"{int((~ok).sum())} rows hold ids outside [0, {E}) or repeated ids "
                            f"(first: row {int((~ok).nonzero()[0])})")
        chosen = torch.zeros(T, E, dtype=torch.bool, device=dev).scatter_(1, safe, True)
        gsz = E // G
        if G > 1:
            gs = c.view(T, G, gsz).topk(2, dim=-1).values.sum(dim=-1)          # [T, G]
            kth = gs.topk(topk_group, dim=-1).values[:, -1:]                    # topk_group-th best
            must = gs > kth + 2 * TIE_TOL
            elig = gs >= kth - 2 * TIE_TOL
            hit = chosen.view(T, G, gsz).any(dim=-1)
            group_ok = ~(hit & ~elig).any(dim=1)
            need = must | hit
            free = topk_group - need.sum(dim=1)
            group_ok &= free >= 0
            # fill the free slots with the tied groups whose best expert is lowest (they then
            # constrain the chosen experts least); none of them holds a chosen expert
            gmax = c.view(T, G, gsz).amax(dim=-1)
            cand = torch.where(elig & ~need, gmax, torch.full_like(gmax, float("inf")))
            order = cand.argsort(dim=1)
            rank = torch.empty_like(order).scatter_(1, order, torch.arange(G, device=dev).expand(T, G).contiguous())
            fill = (rank < free.clamp(min=0)[:, None]) & (elig & ~need)
            in_s = (need | fill)[:, :, None].expand(T, G, gsz).reshape(T, E)
            if int((~group_ok).sum()):
                r = int((~group_ok).nonzero()[0])
                problems.append(f"{int((~group_ok).sum())} rows choose experts outside the top-{topk_group} groups "
                                f"(first: row {r}, groups {sorted(set((safe[r] // gsz).tolist()))})")
            ok &= group_ok
        else:
            in_s = torch.ones(T, E, dtype=torch.bool, device=dev)
        low = torch.where(chosen, c, torch.full_like(c, float("inf"))).amin(dim=1)
        high = torch.where(in_s & ~chosen, c, torch.full_like(c, float("-inf"))).amax(dim=1)
        top_ok = low >= high - TIE_TOL
        if int((in_range & ~top_ok).sum()):
            r = int((in_range & ~top_ok).nonzero()[0])
            problems.append(f"{int((in_range & ~top_ok).sum())} rows are not a top-{k} of the choice scores s + bias "
                            f"(first: row {r}: lowest chosen {float(low[r]):.7g} < best unchosen {float(high[r]):.7g})")
        ok &= top_ok
        bad_rows |= ~ok
    if "topk_weights" in names:
        sel = s.gather(1, safe)
        exp = sel / sel.sum(dim=1, keepdim=True) * rsf
        got = w.to(torch.float64)
        close = ((got - exp).abs() <= WEIGHT_ATOL + WEIGHT_RTOL * exp.abs()).all(dim=1) & in_range
        if int((~close).sum()):
            r = int((~close).nonzero()[0])
            problems.append(f"{int((~close).sum())} rows have weights that are not the renormalised, scaled sigmoid "
                            f"scores of their ids (first: row {r}: {got[r].tolist()} vs {exp[r].tolist()})")
        bad_rows |= ~close
    return not problems, float(int(bad_rows.sum())), "; ".join(problems)
