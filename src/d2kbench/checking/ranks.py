"""The check of a distributed workload that no single output can show: every rank returns the
same bits (``Workload.ranks`` > 1).

An all-reduce whose ranks sum their peers in different orders, or a two-shot design whose
ranks normalise different rows with different code, returns outputs that each pass a
tolerance against the reference and yet differ between ranks; the next layer then diverges
across the tensor-parallel group. A multi-GPU runner gathers each rank's outputs (on one
device or the CPU) and calls :func:`identical_across_ranks`.
"""

from __future__ import annotations

import torch

from d2kbench.checking.checks import bit_pattern
from d2kbench.results import CheckResult


def identical_across_ranks(call: int, names: list[str], per_rank: list[list[torch.Tensor]]) -> list[CheckResult]:
    """One check per output: every rank's tensor is bitwise identical to rank 0's.

    Args:
        call: the call's label, as in :class:`d2kbench.results.CheckResult`.
        names: the outputs' names, in order.
        per_rank: ``per_rank[r][k]``: output ``k`` of rank ``r`` (any shape and dtype; NaNs
            compare by their bits, so a NaN at the same place with the same payload is identical).

    Returns:
        ``[CheckResult(name=f"{name}:identical_across_ranks", ...)]``: error = the number of
        ranks whose tensor differs from rank 0's (shape, dtype or any bit), threshold 0; the
        detail names the first such rank and its first differing element.

    Raises:
        ValueError: fewer than two ranks, or a rank with a different number of outputs.
    """
    if len(per_rank) < 2:
        raise ValueError(f"identical_across_ranks needs at least two ranks, got {len(per_rank)}")
    if any(len(outs) != len(names) for outs in per_rank):
        raise ValueError(f"every rank must return {len(names)} outputs ({', '.join(names)})")
    results = []
    for k, name in enumerate(names):
        first = per_rank[0][k]
        differ: list[str] = []
        for r, outs in enumerate(per_rank[1:], start=1):
            t = outs[k]
            if t.shape != first.shape or t.dtype != first.dtype:
                differ.append(f"rank {r} returned {list(t.shape)} {t.dtype}, rank 0 {list(first.shape)} {first.dtype}")
                continue
            neq = bit_pattern(t.detach().cpu()) != bit_pattern(first.detach().cpu())
            if bool(neq.any()):
                at = tuple(int(i) for i in neq.nonzero()[0].tolist())
                differ.append(f"rank {r} differs from rank 0 in {int(neq.sum())} elements (first at {at})")
        results.append(CheckResult(call=call, name=f"{name}:identical_across_ranks", metric="exact",
                                   against="rank 0", passed=not differ, error=float(len(differ)),
                                   threshold=0.0, detail="; ".join(differ[:1])))
    return results
