"""Cost of moving a call's tensors between the parent and a worker (CUDA IPC), on the GPU.

The harness sends every call's inputs to the solution's worker and gets the outputs back
through torch.multiprocessing (CUDA IPC handles). This script times that transport alone for
a given tensor size: a spawned echo process receives a tensor, clones it (as the worker clones
outputs) and sends the clone back. Three patterns:

* ``fresh``: a new allocation per round trip (what the harness does: fresh inputs each call);
* ``reused``: the same tensor every round trip (IPC handles cached);
* ``empty_cache``: fresh allocations with ``torch.cuda.empty_cache()`` in between.

Usage (repo root, a GPU)::

    python devtools/ipc_cost.py [--gib 2.0] [--trips 5]

Prints one line per pattern: mean and max round-trip ms.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.multiprocessing as mp


def _echo(conn) -> None:
    torch.cuda.set_device(0)
    keep = None
    while True:
        msg = conn.recv()
        if msg is None:
            return
        keep = msg.clone()
        torch.cuda.synchronize()
        conn.send(keep)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--trips", type=int, default=5)
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_echo, args=(child,), daemon=True)
    proc.start()
    n = int(a.gib * (1 << 30) / 2)
    base = torch.randn(n, device="cuda", dtype=torch.float32).to(torch.bfloat16)

    def trip(x):
        t0 = time.perf_counter()
        parent.send(x)
        y = parent.recv()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3, y

    trip(base.clone())  # start-up (CUDA context of the echo process)
    for pattern in ("fresh", "reused", "empty_cache"):
        ms = []
        for _ in range(a.trips):
            x = base if pattern == "reused" else base.clone()
            t, y = trip(x)
            ms.append(t)
            del y
            if pattern == "empty_cache":
                del x
                torch.cuda.empty_cache()
        print(f"{pattern:12s} {a.gib:.2f} GiB: mean {sum(ms) / len(ms):8.1f} ms  max {max(ms):8.1f} ms", flush=True)
    parent.send(None)
    proc.join(timeout=10)


if __name__ == "__main__":
    main()
