"""devtools/latency_skeletons.py: the moe_grouped_topk routing skeletons move the task's SOL
bytes and their top-k chain does the selection's dependent steps.

Under the CPU interpreter, on small workloads of the task's own generator: every level reads
each logit once, the bias (once per program) and writes k weights and k ids per row: exactly
the floor formula ``4 T E + 4 E + 8 T k`` (:func:`bandwidth_skeletons.count_bytes`); the chain's
stored maxima are the top-k choice scores of the groups that survive by their best score.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

from d2kbench.checking.inputs import make_args
from d2kbench.tasks import load_task
from d2kbench.tasks.schema import Workload

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")

_DEV = Path(__file__).resolve().parents[1] / "devtools"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, _DEV / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, mod)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def mods():
    return _load("latency_skeletons"), _load("bandwidth_skeletons")


CASES = [({"T": 7, "E": 32, "G": 4, "k": 4}, {"topk_group": 2, "scale": 2.5}, 4),
         ({"T": 5, "E": 48, "G": 1, "k": 6}, {"topk_group": 1, "scale": 2.827}, 2),
         ({"T": 9, "E": 64, "G": 8, "k": 8}, {"topk_group": 4, "scale": 1.0, "variant": "negative"}, 1)]


def _args(axes, params, seed=3):
    task = load_task("moe_grouped_topk")
    wl = Workload(id="test", axes=axes, params=params, source="test")
    return task, wl, make_args(task.reference_module(), task.spec, wl, seed, "cpu")


@pytest.mark.parametrize("steps", [0, 1, 2])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_routing_skeleton_moves_the_sol_bytes(mods, case, steps):
    ls, bs = mods
    axes, params, bt = CASES[case]
    task, wl, args = _args(axes, params)
    call = ls.route_call([args], steps, bt, 1)
    w, ids = call.outputs[0]
    counts = bs.count_bytes(lambda: call(0), {"router_logits": args[0], "e_score_correction_bias": args[1],
                                              "topk_weights": w, "topk_ids": ids})
    T, E, k = axes["T"], axes["E"], axes["k"]
    assert counts["router_logits"]["read"] == counts["router_logits"]["read_requested"] == 4 * T * E
    assert counts["e_score_correction_bias"]["read"] == 4 * E
    assert counts["topk_weights"]["written"] == counts["topk_ids"]["written"] == 4 * T * k
    assert counts["other"]["read"] == counts["other"]["written"] == 0
    moved = sum(v["read"] + v["written"] for n, v in counts.items() if n != "other")
    assert moved == bs.sol_bytes(task, wl)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_topk_chain_selects(mods, case):
    """The chain's k maxima are the k best choice scores x + b of the surviving groups (ranked by
    their best score), best first: the dependent steps are really done."""
    ls, _ = mods
    axes, params, bt = CASES[case]
    _, _, args = _args(axes, params)
    call = ls.route_call([args], 2, bt, 1)
    w, _ = call(0)
    T, E, G, k = axes["T"], axes["E"], axes["G"], axes["k"]
    c = (args[0] + args[1]).view(T, G, E // G)
    keep = torch.topk(c.amax(2), params["topk_group"], dim=1).indices
    masked = torch.full_like(c, float("-inf"))
    masked.scatter_(1, keep[:, :, None].expand(-1, -1, E // G), c.gather(1, keep[:, :, None].expand(-1, -1, E // G)))
    want = torch.topk(masked.view(T, E), k, dim=1).values
    assert torch.equal(w, want)
