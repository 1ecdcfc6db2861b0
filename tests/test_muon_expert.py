"""CPU tests (TRITON_INTERPRET=1) of the expert Muon / Polar Express Triton solution.

Small shapes exercise masking (blocks larger than the matrix, ragged edges), the TMA and the
pointer load paths, mirrored off-diagonal tiles of the symmetric products, tall inputs
(transposed iterate) and square inputs.  Accuracy is measured against ``reference.oracle``
(FP64) as the per-matrix relative Frobenius error.
"""

import dataclasses

import pytest
import torch

from d2kbench.suite.muon_newton_schulz import reference
from d2kbench.tasks import load_task
from d2kbench.tasks.loader import import_file

expert = None  # the expert module with interpreted kernels, set by the fixture below


@pytest.fixture(autouse=True, scope="module")
def _interpreted_expert():
    """Import expert.py afresh with TRITON_INTERPRET=1 (read when its kernels are decorated),
    without leaking the variable into other test modules of the same process."""
    global expert
    mp = pytest.MonkeyPatch()
    mp.setenv("TRITON_INTERPRET", "1")
    expert = import_file(load_task("muon_newton_schulz").root / "solutions" / "expert.py", "d2k_test_expert_interp")
    yield
    mp.undo()

TOL = 1e-2


def _rel_err(out: torch.Tensor, ref64: torch.Tensor) -> torch.Tensor:
    diff = (out.double() - ref64).flatten(1).norm(dim=1)
    return diff / ref64.flatten(1).norm(dim=1)


def _cfg(**kw):
    return dataclasses.replace(expert.config_for(1, 1), **kw)


@pytest.mark.parametrize(
    "B,M,N,variant,use_tma",
    [
        (2, 32, 96, "gaussian", True),  # wide, TMA path, blocks == m
        (2, 32, 96, "gaussian", False),  # same through pointer loads
        (1, 64, 48, "gaussian", True),  # tall: transposed iterate, ragged m = 48 (pointer path)
        (1, 40, 40, "gaussian", True),  # square, ragged tiles
        (2, 64, 160, "gaussian", True),  # 2x2 tiles: mirrored off-diagonal tiles
        (1, 70, 130, "gaussian", False),  # ragged everything, pointer path
        (1, 64, 128, "ill_conditioned", True),
        (1, 64, 128, "low_rank_noise", True),
    ],
)
def test_matches_oracle(B, M, N, variant, use_tma):
    G = reference.make_inputs({"B": B, "M": M, "N": N, "variant": variant}, seed=0, device="cpu")["G"]
    out = expert.run_with_config(G, 5, _cfg(use_tma=use_tma))
    assert out.dtype == torch.bfloat16 and out.shape == G.shape and out.is_contiguous()
    assert out.data_ptr() != G.data_ptr()
    assert torch.isfinite(out.float()).all()
    err = _rel_err(out, reference.oracle(G))
    tol = TOL if variant == "gaussian" else 0.1  # pathological inputs: stay close to the reference
    assert err.max().item() < tol, (variant, err)


@pytest.mark.parametrize("state_mode", ["sym", "full"])
def test_state_mode_variants(state_mode):
    G = reference.make_inputs({"B": 1, "M": 64, "N": 96}, seed=1, device="cpu")["G"]
    out = expert.run_with_config(G, 5, _cfg(state_mode=state_mode))
    assert _rel_err(out, reference.oracle(G)).max().item() < TOL


def test_run_default_entry_point_and_padded_iterate():
    G = reference.make_inputs({"B": 2, "M": 32, "N": 100}, seed=2, device="cpu")["G"]
    assert expert._normalize(G, False).stride(1) == 128  # rows padded to 64 elements
    assert _rel_err(expert.run(G), reference.oracle(G)).max().item() < TOL


def test_steps_must_be_five():
    G = reference.make_inputs({"B": 1, "M": 16, "N": 32}, seed=0, device="cpu")["G"]
    for steps in (0, 4, 6):
        with pytest.raises(ValueError):
            expert.run(G, steps=steps)
    with pytest.raises(ValueError):
        expert.run(G[0], steps=5)


def test_coefficients_match_reference():
    assert expert.POLAR_EXPRESS_COEFFS == reference.POLAR_EXPRESS_COEFFS


@pytest.mark.parametrize("use_tma", [True, False])
def test_symmetric_products(use_tma):
    """Upper-triangle tiles + mirrored stores give the full products, fused epilogue included."""
    torch.manual_seed(0)
    cfg = _cfg(use_tma=use_tma)
    X = (torch.randn(2, 64, 96) / 8).half()
    R = expert._sym_product(X, None, cfg)
    R_ref = X.float() @ X.float().mT
    torch.testing.assert_close(R.float(), R_ref, atol=2e-3, rtol=2e-3)
    _assert_mirrored(R, cfg.sym_block)
    a, b, c = 1.5, -0.5, 0.25
    P = expert._sym_product(R, R, cfg, alpha=c, C=R, beta=b, diag=a)
    Rf = R.float()
    P_ref = c * Rf @ Rf + b * Rf + a * torch.eye(64)
    torch.testing.assert_close(P.float(), P_ref, atol=5e-3, rtol=2e-3)
    _assert_mirrored(P, cfg.sym_block)


def _assert_mirrored(R: torch.Tensor, block: int) -> None:
    """Off-diagonal tiles are stored with their transpose, so they are bit-for-bit symmetric;
    a diagonal tile is computed once, and its symmetry is that of the dot product's accumulation
    order (NumPy's BLAS kernel under the interpreter: X[35] . X[45] and X[45] . X[35] differed by
    one FP16 subnormal step on one CPU), so within one unit in the last place there."""
    tile = torch.arange(R.shape[-1]) // block
    off = (tile[:, None] != tile[None, :]).expand_as(R)
    assert torch.equal(R[off], R.mT[off])
    torch.testing.assert_close(R.float(), R.mT.float(), atol=2 ** -24, rtol=2 ** -10)


def test_flop_counts():
    B, m, n = 1, 2048, 5464
    u, r = 2 * m**3, n / m
    assert expert.expert_flops(B, m, n) == pytest.approx((3 * r + 7.5) * u)
    assert expert.expert_flops(B, m, n, state_mode="sym") == pytest.approx((3 * r + 7) * u)
    assert expert.expert_flops(B, m, n, state_mode="full") == pytest.approx((3 * r + 8.5) * u)
    assert expert.standard_flops(B, n, m) == pytest.approx((10 * r + 5) * u)
