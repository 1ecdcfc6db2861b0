"""Alternative ``flashinfer_ops``: what a serving engineer composes from FlashInfer instead of
writing the fused kernel: ``flashinfer.norm.rmsnorm`` on the query and the key heads,
``flashinfer.rope.apply_rope_with_cos_sin_cache`` (NeoX, the float32 cos/sin table) and
``flashinfer.page.append_paged_kv_cache`` into the NHD pages.

Trusted glue around the library calls: the q/k heads are gathered into contiguous
``[T * H, D]`` rows for the norm (FlashInfer's row norm), and the slot mapping is expressed in
FlashInfer's page metadata with every token as its own one-page request (page
``slot // BS``, in-page position ``slot % BS``). Padding tokens (slot -1) are redirected to the
first valid token's slot with that token's own key and value (the same rows written twice:
identical bytes), so no host synchronisation or data-dependent shape is needed.

FlashInfer is imported inside ``run``: without it (the CPU, or a GPU host without the package)
the call fails with an ImportError that names the package.
"""

from __future__ import annotations

import torch


def _flashinfer():
    try:
        import flashinfer  # noqa: PLC0415 - optional dependency of this alternative only
    except ImportError as e:  # pragma: no cover - depends on the host
        raise ImportError("alternative flashinfer_ops needs the flashinfer package (pip install "
                          "flashinfer-python; its kernels JIT-compile with the host's nvcc)") from e
    return flashinfer


def run(qkv: torch.Tensor, q_norm_weight: torch.Tensor, k_norm_weight: torch.Tensor, cos_sin_cache: torch.Tensor,
        positions: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, slot_mapping: torch.Tensor,
        num_q_heads: int, eps: float) -> torch.Tensor:
    """Same arguments and results as ``reference.run`` (caches updated in place, returns
    ``q_out [T, Hq, D]``).

    Raises:
        ImportError: flashinfer is not installed.
    """
    fi = _flashinfer()
    T = qkv.shape[0]
    NB, BS, Hkv, D = key_cache.shape
    Hq = num_q_heads
    x = qkv.view(T, Hq + 2 * Hkv, D)
    q = fi.norm.rmsnorm(x[:, :Hq].reshape(T * Hq, D), q_norm_weight, eps=eps).view(T, Hq * D)
    k = fi.norm.rmsnorm(x[:, Hq:Hq + Hkv].reshape(T * Hkv, D), k_norm_weight, eps=eps).view(T, Hkv * D)
    q_rot, k_rot = fi.rope.apply_rope_with_cos_sin_cache(positions, q, k, D, cos_sin_cache, is_neox=True)
    valid = slot_mapping >= 0
    first = torch.argmax(valid.to(torch.int32))
    src = torch.where(valid, torch.arange(T, device=qkv.device), first)
    slot = slot_mapping[src].clamp_min(0)
    keys = k_rot.view(T, Hkv, D)[src]
    values = x[:, Hq + Hkv:][src]
    if T:
        ones = torch.arange(T + 1, dtype=torch.int32, device=qkv.device)
        fi.page.append_paged_kv_cache(
            keys, values, ones[:T], (slot % BS).to(torch.int32), (key_cache, value_cache),
            (slot // BS).to(torch.int32), ones, (slot % BS + 1).to(torch.int32), kv_layout="NHD")
    return q_rot.view(T, Hq, D)
