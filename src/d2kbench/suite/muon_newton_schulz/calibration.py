"""Tolerance probes for muon_newton_schulz: implementations the tolerance must accept or reject.

``d2k calibrate muon_newton_schulz`` measures every probe's error against the task's checks on
each workload (GPU: the registered ones) and reports whether the task's thresholds separate
them; the numbers go into the tolerance rationale in task.yaml. The probes are trusted PyTorch
code run in the harness's own process, not solutions.
"""

from __future__ import annotations

import torch

from d2kbench.suite.muon_newton_schulz.reference import (
    NORM_EPS,
    NORM_SCALE,
    NUM_STEPS,
    POLAR_EXPRESS_COEFFS,
    _polar_express,
)

C = POLAR_EXPRESS_COEFFS


def gram_restart_fp16(G: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The expert's algebra in plain PyTorch (FP16): Gram-side composition with the fixed restart
    before coefficient 2; the state products in FP16 with FP32 accumulation (cuBLAS)."""
    tall = G.shape[-2] > G.shape[-1]
    X = (G.mT if tall else G).float()
    X = (X / (torch.linalg.matrix_norm(X, keepdim=True) * NORM_SCALE + NORM_EPS)).half()
    for segment in (C[:2], C[2:]):
        A = X @ X.mT
        Q = None
        for i, (a, b, c) in enumerate(segment):
            eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
            P = a * eye + b * A + c * (A @ A)
            Q = P if Q is None else P @ Q
            if i + 1 < len(segment):
                A = P @ A @ P
        X = Q @ X
    return (X.mT if tall else X).to(torch.bfloat16).contiguous()


#: (name, function of (G, steps) -> out, "accept" | "reject"). A probe to reject must fail on at
#: least one workload (as a solution fails the task); one to accept must pass on every workload.
#: Wrong normalisations: without the 1.02 safety factor, and one norm over the whole batch.
PROBES = [
    ("reference_fp16", lambda G, s: _polar_express(G, s, torch.float16, torch.bfloat16), "accept"),
    ("gram_restart_fp16", gram_restart_fp16, "accept"),
    ("bf16_iterate", lambda G, s: _polar_express(G, s, torch.bfloat16, torch.bfloat16), "reject"),
    ("four_steps", lambda G, s: _polar_express(G, s, torch.float16, torch.bfloat16, coeffs=C[:4]), "reject"),
    ("repeated_triple", lambda G, s: _polar_express(G, s, torch.float16, torch.bfloat16,
                                                    coeffs=(C[0], C[1], C[1], C[3], C[4])), "reject"),
    ("no_safety_factor", lambda G, s: _polar_express(G, s, torch.float16, torch.bfloat16, norm_scale=1.0), "reject"),
    ("batch_norm", lambda G, s: _polar_express(G, s, torch.float16, torch.bfloat16, norm_dims=(0, 1, 2)), "reject"),
]
assert NUM_STEPS == len(C)
