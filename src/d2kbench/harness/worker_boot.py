"""``python -m d2kbench.harness.worker_boot FD``: the first code a solution worker runs.

The parent (:class:`d2kbench.harness.process.WorkerHandle`) starts this module inside the
sandbox with one end of a socket pair as file descriptor ``FD``. The first message on it
(plain data) says what to run: task folder, solution file, device, options, and the
multiprocessing authentication key that lets the two processes pass tensors (file
descriptors of shared memory on the CPU, CUDA IPC handles on the GPU) through
torch.multiprocessing's reductions. Then :func:`d2kbench.harness.worker.worker_main` serves
requests until the parent says ``exit`` or closes the pipe.

An untrusted solution's worker on the CPU first forbids itself to start processes or programs
(:func:`d2kbench.sandbox.seccomp.forbid_new_processes`), while it has one thread and before
anything of the solution is loaded: a process the solution started would do its work
unwatched (:func:`process_filter_wanted`).
"""

from __future__ import annotations

import multiprocessing
import sys
from multiprocessing.connection import Connection

# Imports inside functions: the seccomp filter is installed before anything else is imported.


def process_filter_wanted(device: str, options: dict) -> bool:
    """Whether a worker forbids itself new processes: an untrusted solution (not the task's
    reference or an alternative; integrity checks on) on the CPU. A GPU worker needs them
    (Triton's compiler runs ptxas)."""
    return device == "cpu" and not options.get("trusted") and options.get("integrity", True) is not False


def serve(fd: int) -> None:
    """Read the first message from the pipe at descriptor ``fd``, forbid new processes where
    :func:`process_filter_wanted`, and serve the parent's requests until it says ``exit``
    (also the entry of a worker forked by :mod:`d2kbench.harness.forkserver`)."""
    conn = Connection(fd)
    init = conn.recv()
    if process_filter_wanted(init["device"], init["options"]):
        from d2kbench.sandbox.seccomp import forbid_new_processes

        why_not = forbid_new_processes()
        init["options"]["process_filter"] = "seccomp" if not why_not else f"none ({why_not})"
        if why_not:
            print(f"d2k worker: WARNING: could not forbid new processes: {why_not}", file=sys.stderr, flush=True)
    multiprocessing.current_process().authkey = init["authkey"]
    import torch.multiprocessing  # noqa: F401 - registers the tensor reductions before any tensor arrives

    from d2kbench.harness.worker import worker_main

    worker_main(conn, init["task_root"], init["solution_path"], init["device"], init["options"])


def main(argv: list[str]) -> None:
    serve(int(argv[1]))


if __name__ == "__main__":
    main(sys.argv)
