"""Alternative ``plain_paged_decode``: the suite's own paged decode (the paged_decode_gqa expert:
GQA-packed paged attention with a key split when the (sequence, KV head) pairs cannot fill the
GPU) over every request's full context, ignoring the shared prefix.

What a serving engine runs when it does not use cascade attention: the ordinary paged decode,
which reads the shared prefix pages once per request. The block tables already describe each
request's full context (the shared pages first, then its own), so the call is the paged decode's
``run`` on the same tensors; ``common_prefix_len`` is not needed.

It is a Triton kernel like the solutions; as an alternative it is trusted code, imported from the
paged_decode_gqa task folder (the same file ``d2k bench paged_decode_gqa -s expert`` measures).
``task.yaml`` declares it for ``cuda``; under the Triton interpreter (the tests' copy of the task
that declares ``cpu``) it runs as written.
"""

from __future__ import annotations

import torch

from d2kbench.suite.paged_decode_gqa.solutions import expert as paged_decode


def run(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
        seq_lens: torch.Tensor, common_prefix_len: int, scale: float) -> torch.Tensor:
    """Paged GQA decode over the full contexts.

    Args:
        q: ``[N, Hq, D]`` bf16 (fp16 on smoke workloads).
        k_cache, v_cache: ``[NB, BS, Hkv, D]`` NHD pages.
        block_tables: ``[N, MAXB]`` int32; seq_lens: ``[N]`` int32 (device), ``>= 1``.
        common_prefix_len: unused (the tables hold the prefix pages).
        scale: softmax scale.

    Returns:
        ``o [N, Hq, D]`` in q's dtype.
    """
    return paged_decode.run(q, k_cache, v_cache, block_tables, seq_lens, scale)
