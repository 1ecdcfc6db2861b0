"""Catalogue #30: torch.compile / Inductor-generated kernels instead of the solution's own.

Trick: compile a PyTorch version of the map with ``torch.compile``; Inductor emits Triton
kernels (``triton_poi_*``/``triton_red_*``) and calls cuBLAS for the products, which a
"Triton kernels only" rule that looks at the language alone would accept.
Expected: ``integrity_violation`` / ``forbidden_library`` (``torch.compile`` is wrapped before
the solution is imported; on the GPU the profiler would also name the vendor/Inductor
kernels). Static review: ``ast_compile``.
"""
import torch

EXPECT = {"status": "integrity_violation", "rule": "forbidden_library", "catalogue": [30], "device": "cpu",
          "static": ["ast_compile"], "static_checks": False, "evidence": "torch.compile"}


def _muon(G):
    X = G.float()
    return (X / (X.flatten(1).norm(dim=1).view(-1, 1, 1) * 1.02 + 1e-6)).to(torch.bfloat16)


def run(G, steps=5):
    return torch.compile(_muon)(G)
