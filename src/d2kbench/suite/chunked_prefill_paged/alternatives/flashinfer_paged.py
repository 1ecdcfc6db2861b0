"""Alternative ``flashinfer_paged``: FlashInfer, the library kernel SGLang and vLLM call for a
prefill batch over a paged cache with prefixes: ``flashinfer.page.append_paged_kv_cache`` writes
the new keys and values into their pages, then ``BatchPrefillWithPagedKVCacheWrapper``
(NHD pages, ``causal=True``: FlashInfer aligns the diagonal to the last key, so new token r of a
request sees its ctx + r + 1 keys; GQA by its own head map) attends over each request's pages.

Trusted glue: the page lists are FlashInfer's CSR form of the block tables (``kv_indptr`` from
the page counts ``cdiv(ctx + q, BS)``, ``kv_indices`` the used table entries in order,
``kv_last_page_len``), the per-token request and position for the append. ``plan`` runs on
every call (the lengths change on every call; a model amortises one plan over its layers, the
timed figure includes it). FlashInfer is imported inside ``run`` (declared for ``cuda`` only):
without it the call fails with a message naming the package.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location("chunked_prefill_paged_alt_gather_fi", Path(__file__).with_name("_gather.py"))
_gather = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_gather)

#: FlashInfer's float workspace (its examples use 128 MB).
WORKSPACE_BYTES = 128 << 20
_WRAPPERS: dict = {}


def run(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, cu_seqlens_q: torch.Tensor,
        k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
        slot_mapping: torch.Tensor, max_seqlen_q: int, max_context_len: int, scale: float) -> torch.Tensor:
    """Same arguments and results as ``reference.run`` (caches updated in place; ``o [T, Hq, D]``).

    Raises:
        RuntimeError: flashinfer is not installed, or it rejects the inputs.
    """
    try:
        import flashinfer
    except ImportError as e:
        raise RuntimeError("alternative flashinfer_paged needs the flashinfer package "
                           "(pip install flashinfer-python; it JIT-compiles its kernels with nvcc)") from e
    T, Hq, D = q.shape
    NB, BS, Hkv, _ = k_cache.shape
    ql = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
    kl = context_lens + ql
    n_pages = (kl + BS - 1) // BS
    kv_indptr = torch.zeros(kl.shape[0] + 1, dtype=torch.int32, device=q.device)
    kv_indptr[1:] = torch.cumsum(n_pages, 0)
    used = torch.arange(block_tables.shape[1], device=q.device)[None, :] < n_pages[:, None]
    kv_indices = block_tables[used].to(torch.int32)
    last_len = ((kl - 1) % BS + 1).to(torch.int32)
    req, pos = _gather.token_positions(cu_seqlens_q, context_lens, T)
    flashinfer.page.append_paged_kv_cache(k_new, v_new, req.to(torch.int32), pos.to(torch.int32), (k_cache, v_cache),
                                          kv_indices, kv_indptr, last_len, kv_layout="NHD")
    key = q.device
    if key not in _WRAPPERS:
        ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=q.device)
        _WRAPPERS[key] = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    wrapper = _WRAPPERS[key]
    wrapper.plan(cu_seqlens_q, kv_indptr, kv_indices, last_len, Hq, Hkv, D, BS, causal=True, sm_scale=scale,
                 q_data_type=q.dtype, kv_data_type=k_cache.dtype)
    return wrapper.run(q, (k_cache, v_cache)).contiguous()
