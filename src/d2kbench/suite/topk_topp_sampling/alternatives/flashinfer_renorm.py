"""Alternative ``flashinfer_renorm``: what a serving engineer composes from FlashInfer when the
random numbers are given: FlashInfer's sorting-free filters on the tempered logits
(``flashinfer.sampling.top_k_mask_logits``), a softmax, FlashInfer's top-p renormalisation
(``flashinfer.sampling.top_p_renorm_probs``), then the inverse CDF of the given uniforms in
vocabulary order in PyTorch (FP32 ``cumsum`` and ``searchsorted``, as a user writes it).

FlashInfer's fused samplers (``top_k_top_p_sampling_from_logits`` / ``_from_probs``) draw their
own Philox numbers inside the kernel (rejection rounds), so their ids cannot follow this task's
random-stream contract; they are not a checked alternative.

FlashInfer is imported inside ``run``: without it (the CPU, or a GPU host without the package)
the call fails with an ImportError that names the package.
"""

from __future__ import annotations

import torch


def _flashinfer():
    try:
        import flashinfer  # noqa: PLC0415 - optional dependency of this alternative only
    except ImportError as e:  # pragma: no cover - depends on the host
        raise ImportError("alternative flashinfer_renorm needs the flashinfer package (pip install "
                          "flashinfer-python; its kernels JIT-compile with the host's nvcc)") from e
    return flashinfer


def run(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
        uniforms: torch.Tensor) -> torch.Tensor:
    """Same arguments and result as ``reference.run`` (``ids [B]`` int64).

    Raises:
        ImportError: flashinfer is not installed.
    """
    fi = _flashinfer()
    B, V = logits.shape
    z = logits / temperature[:, None]
    zk = fi.sampling.top_k_mask_logits(z, top_k.to(torch.int32))
    probs = torch.softmax(zk, dim=-1)
    probs = fi.sampling.top_p_renorm_probs(probs, top_p.float())
    cum = probs.cumsum(dim=1)
    ids = torch.searchsorted(cum, uniforms[:, None] * cum[:, -1:], right=True)
    kept = probs > 0
    last = (V - 1) - torch.flip(kept, dims=[1]).to(torch.int8).argmax(dim=1, keepdim=True)
    return torch.minimum(ids, last)[:, 0].to(torch.int64).contiguous()
