"""One rank of the CPU ground truth of allreduce_residual_rmsnorm: a real ``torch.distributed``
all-reduce on gloo, then the task's residual add + RMSNorm (+ quantisation) on every rank.

Started by ``tests/test_task_allreduce_residual_rmsnorm.py`` through ``torch.multiprocessing``
(forked ranks; a module of its own so that a spawned rank would import only torch and the
reference). Each rank runs single-threaded: four ranks share the test machine's cores.
"""

from __future__ import annotations

from pathlib import Path


def rank_main(rank: int, world: int, port: int, inputs_path: str, out_dir: str) -> None:
    """Rank ``rank`` of ``world``: all-reduce its partial (float64 over all ranks, and float32
    over the pair {0, 1}), apply the reference epilogue to each sum, save the outputs.

    Args:
        inputs_path: ``torch.save`` of ``{"partials": [world x [T, H]], "residual", "weight",
            "eps", "group_size", "quant"}`` (the task's inputs).
        out_dir: where ``{rank}.pt`` is written: ``{"all": (y, y_s, residual)}`` and, on ranks 0
            and 1, ``{"pair": (y, y_s, residual)}``.
    """
    import torch
    import torch.distributed as dist

    from d2kbench.tasks.loader import import_file

    torch.set_num_threads(1)
    root = Path(__file__).resolve().parents[1] / "src" / "d2kbench" / "suite" / "allreduce_residual_rmsnorm"
    ref = import_file(root / "reference.py", "allreduce_residual_rmsnorm_reference_gloo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        d = torch.load(inputs_path)
        extra = (d["weight"], d["eps"], d["group_size"], d["quant"])
        out = {}
        # float64: the sum of `world` 16-bit values is exact in any order, so gloo's ring order
        # cannot differ from the task's rank order before the float32 rounding
        s = d["partials"][rank].double()
        dist.all_reduce(s)
        res = d["residual"].clone()
        out["all"] = (*ref.epilogue(s.float(), res, *extra), res)
        pair = dist.new_group([0, 1])  # every rank takes part in creating a group
        if rank < 2:  # two ranks: a + b is commutative, so float32 on gloo is the task's sum bit for bit
            s2 = d["partials"][rank].float()
            dist.all_reduce(s2, group=pair)
            res2 = d["residual"].clone()
            out["pair"] = (*ref.epilogue(s2, res2, *extra), res2)
        torch.save(out, Path(out_dir) / f"{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()
