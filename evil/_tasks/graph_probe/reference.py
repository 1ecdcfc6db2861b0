"""graph_probe: inputs and PyTorch reference (out = 2 x + y)."""

from __future__ import annotations

import torch


def make_inputs(workload: dict, seed: int, device) -> dict:
    """Two float32 vectors of length ``workload["N"]`` from a seeded generator on ``device``."""
    gen = torch.Generator(device=device).manual_seed(seed)
    n = int(workload["N"])
    return {"x": torch.randn(n, generator=gen, device=device), "y": torch.randn(n, generator=gen, device=device)}


def run(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``2 * x + y`` as a new tensor."""
    return 2 * x + y
