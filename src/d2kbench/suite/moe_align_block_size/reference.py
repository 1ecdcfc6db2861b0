"""MoE align-block-size (counting sort of token->expert assignments with block padding):
inputs, PyTorch reference and the property check of its non-unique outputs.

The operator. ``topk_ids [T, k]`` int32 holds, for each token, the ``k`` experts it is routed
to (values in ``[0, E)``). Flatten it to ``n = T * k`` assignments ``a = t * k + j``. The
outputs group the assignments by expert, each expert's group padded up to a multiple of the
block size ``B``, so that every ``B``-row block of the result belongs to one expert (the
layout a grouped MoE GEMM consumes):

* ``sorted_token_ids [n + E * (B - 1)]`` int32: the concatenation, in expert order
  ``0 .. E-1``, of one *segment* per expert of length ``ceil(count_e / B) * B``. Expert ``e``'s
  segment holds each assignment routed to ``e`` exactly once, in any order, and the sentinel
  ``n`` in its remaining (padding) slots. Entries past the last segment are unspecified.
* ``expert_ids [ceil((n + E * (B - 1)) / B)]`` int32: the expert owning each block of
  ``sorted_token_ids``; entries past ``num_tokens_post_padded / B`` are unspecified.
* ``num_tokens_post_padded [1]`` int32: the total padded length ``sum_e ceil(count_e / B) * B``.

Only ``num_tokens_post_padded`` is unique; the order inside a segment is free, so the other
two outputs are checked by properties (:func:`check`), not against the reference's values.
"""

from __future__ import annotations

import torch


def make_inputs(workload: dict, seed: int, device: str | torch.device) -> dict:
    """Draw the inputs of one call.

    Args:
        workload: axes ``T`` (tokens), ``k`` (experts per token), ``E`` (experts), ``B`` (block
            size), and optionally ``routing``: ``"uniform"`` (default: each token picks ``k``
            distinct experts uniformly at random, as a softmax top-k of random logits does) or
            ``"skewed"``: one hot expert picked by every token, the other picks drawn without
            replacement with Zipf(``zipf_s``, default 1.2) weights over a random expert order,
            and ``empty`` experts (default ``E // 6``) never picked.
        seed: seed of a ``torch.Generator`` on ``device``.
        device: where the tensors are created.

    Returns:
        ``{"topk_ids": Tensor[T, k] int32 contiguous (distinct ids per row, values in [0, E)),
        "block_size": B, "num_experts": E}``.
    """
    T, k, E, B = (int(workload[a]) for a in ("T", "k", "E", "B"))
    routing = workload.get("routing", "uniform")
    gen = torch.Generator(device=device).manual_seed(seed)
    if routing == "uniform":
        scores = torch.rand(T, E, generator=gen, device=device)
    elif routing == "skewed":
        empty = int(workload.get("empty", E // 6))
        if E - empty < k:
            raise ValueError(f"skewed routing needs at least k={k} non-empty experts (E={E}, empty={empty})")
        s = float(workload.get("zipf_s", 1.2))
        perm = torch.randperm(E, generator=gen, device=device)
        logw = torch.empty(E, device=device)
        logw[perm] = -s * torch.log(torch.arange(1, E + 1, device=device, dtype=torch.float32))
        logw[perm[0]] = 1e4                        # the hot expert: picked by every token
        logw[perm[E - empty:]] = float("-inf")     # empty experts: never picked
        u = torch.rand(T, E, generator=gen, device=device).clamp_(1e-12, 1 - 1e-7)
        scores = logw - torch.log(-torch.log(u))   # Gumbel top-k = sampling without replacement
    else:
        raise ValueError(f"unknown routing {routing!r}")
    ids = scores.topk(k, dim=1).indices.to(torch.int32).contiguous()
    return {"topk_ids": ids, "block_size": B, "num_experts": E}


def max_padded(n: int, num_experts: int, block_size: int) -> int:
    """Static upper bound of ``num_tokens_post_padded``: ``n + E * (B - 1)`` (the length of
    ``sorted_token_ids``)."""
    return n + num_experts * (block_size - 1)


def run(topk_ids: torch.Tensor, block_size: int, num_experts: int):
    """Reference alignment: stable sort by expert, padding with the sentinel ``n = T * k``.

    Static shapes only (no host synchronisation), so that it can be captured in a CUDA graph.

    Args:
        topk_ids: ``[T, k]`` int32, values in ``[0, num_experts)``.
        block_size: ``B`` >= 1, the row-block size of the consuming grouped GEMM.
        num_experts: ``E``.

    Returns:
        ``(sorted_token_ids [n + E (B-1)] int32, expert_ids [ceil((n + E (B-1)) / B)] int32,
        num_tokens_post_padded [1] int32)``; unused ``expert_ids`` entries are -1.
    """
    dev = topk_ids.device
    T, k = topk_ids.shape
    n, E, B = T * k, int(num_experts), int(block_size)
    flat = topk_ids.reshape(-1).to(torch.int64)
    counts = torch.zeros(E, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + B - 1) // B * B
    ends = padded.cumsum(0)
    starts = ends - padded
    order = torch.argsort(flat, stable=True)                   # assignments grouped by expert
    sorted_e = flat[order]
    first = counts.cumsum(0) - counts                          # where each expert starts in `order`
    dest = starts[sorted_e] + torch.arange(n, device=dev) - first[sorted_e]
    length = max_padded(n, E, B)
    sorted_ids = torch.full((length,), n, dtype=torch.int32, device=dev)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    block_start = torch.arange((length + B - 1) // B, device=dev) * B
    owner = torch.searchsorted(ends, block_start, right=True)  # first expert whose segment ends after
    expert_ids = torch.where(block_start < ends[-1], owner, -1).to(torch.int32)
    return sorted_ids, expert_ids, ends[-1:].to(torch.int32)


OUTPUTS = ("sorted_token_ids", "expert_ids", "num_tokens_post_padded")


def check(inputs: list, outputs: list, output: str | None = None) -> tuple[bool, float | None, str]:
    """Property check of one output (``output``) or, when ``output`` is None, of all three.

    * ``num_tokens_post_padded``: one element, equal to ``sum_e ceil(count_e / B) * B``.
    * ``sorted_token_ids``: inside ``[0, total)`` (``total`` the exact padded length), the slots
      of expert ``e``'s segment ``[start_e, start_e + padded_e)`` hold every assignment routed
      to ``e`` exactly once and the sentinel ``n`` in all other slots; no other value appears.
      Slots at or past ``total`` are not checked.
    * ``expert_ids``: block ``b < total / B`` holds the expert whose segment contains slot ``b*B``.

    Never raises on malformed outputs: returns ``(passed, number of bad entries, detail)``.
    """
    topk_ids, block_size, num_experts = inputs[0], int(inputs[1]), int(inputs[2])
    names = OUTPUTS if output is None else (output,)
    if len(outputs) != 3:
        return False, None, f"expected 3 outputs, got {len(outputs)}"
    dev = topk_ids.device
    n, E, B = topk_ids.numel(), num_experts, block_size
    flat = topk_ids.reshape(-1).to(torch.int64)
    counts = torch.zeros(E, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + B - 1) // B * B
    ends = padded.cumsum(0)
    total = int(ends[-1])
    sorted_ids, expert_ids, ntpp = (o.to(dev) for o in outputs)
    problems, bad = [], 0
    if "num_tokens_post_padded" in names:
        got = [int(v) for v in ntpp.reshape(-1)[:2].tolist()]
        if ntpp.numel() != 1 or got[0] != total:
            problems.append(f"num_tokens_post_padded is {got}, expected [{total}]")
            bad += 1
    if "sorted_token_ids" in names:
        seg = sorted_ids.reshape(-1)[:total].to(torch.int64)
        if seg.numel() < total:
            return False, None, f"sorted_token_ids has {sorted_ids.numel()} entries, fewer than {total}"
        owner = torch.searchsorted(ends, torch.arange(total, device=dev), right=True)  # expert of each slot
        valid = (seg >= 0) & (seg < n)
        pad = seg == n
        other = ~(valid | pad)
        if int(other.sum()):
            i = int(other.nonzero()[0])
            problems.append(f"{int(other.sum())} slots hold neither an assignment nor the sentinel {n} "
                            f"(first: slot {i} = {int(seg[i])})")
            bad += int(other.sum())
        v = seg[valid]
        seen = torch.zeros(n, dtype=torch.int64, device=dev).scatter_add_(0, v, torch.ones_like(v))
        missing, dup = int((seen == 0).sum()), int((seen > 1).sum())
        if missing or dup:
            problems.append(f"{missing} assignments missing and {dup} duplicated in sorted_token_ids[:{total}]")
            bad += missing + dup
        wrong = flat[v] != owner[valid]
        if int(wrong.sum()):
            i = int(valid.nonzero()[wrong.nonzero()[0]])
            problems.append(f"{int(wrong.sum())} assignments lie outside their expert's segment (first: slot {i} "
                            f"holds assignment {int(seg[i])} of expert {int(flat[seg[i]])}, segment of expert {int(owner[i])})")
            bad += int(wrong.sum())
    if "expert_ids" in names:
        nb = total // B
        got = expert_ids.reshape(-1)[:nb].to(torch.int64)
        want = torch.searchsorted(ends, torch.arange(nb, device=dev) * B, right=True)
        if got.numel() < nb:
            problems.append(f"expert_ids has {expert_ids.numel()} entries, fewer than {nb} blocks")
            bad += nb
        elif int((got != want).sum()):
            i = int((got != want).nonzero()[0])
            problems.append(f"{int((got != want).sum())} of {nb} blocks have the wrong expert "
                            f"(first: block {i} = {int(got[i])}, expected {int(want[i])})")
            bad += int((got != want).sum())
    return not problems, float(bad), "; ".join(problems)
