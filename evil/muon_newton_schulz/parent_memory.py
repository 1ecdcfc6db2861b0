"""Catalogue #34: reading the evaluator's memory.

Trick: the evaluator (the worker's parent) holds each correctness call's pristine inputs next
to the expected outputs it computed from them. Open ``/proc/<parent>/mem`` and search the
parent's writable mappings for this call's input bytes: where the parent's memory is readable,
the expected values are within reach (a stand-in: return a correct result); where it is not,
return a wrong-by-construction one (four Polar Express steps instead of five).
Before the OS sandbox the parent's memory was readable and this passed. Expected now:
``integrity_violation`` / ``host_compute``: the worker's audit hook refuses opening any
process's memory file. Behind it, the parent is in another PID namespace and non-dumpable, so
its memory could not be read anyway (the wrong result would stand: ``incorrect``); those two
layers on their own, without the worker's monitors, are proven by
``tests/test_sandbox.py::test_a_solution_cannot_read_the_evaluators_memory``.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny_muon import muon  # noqa: E402

EXPECT = {"status": "integrity_violation", "rule": "host_compute", "catalogue": [34], "device": "cpu", "static": [],
          "static_checks": False, "evidence": "/mem"}


def _evaluator() -> int | None:
    """The evaluating process: the parent if it is a Python interpreter, else any other Python
    process in sight (the worker itself and its sandbox's init excluded)."""
    def python(pid: int) -> bool:
        try:
            return os.path.basename(os.path.realpath(f"/proc/{pid}/exe")).startswith("python")
        except OSError:
            return False

    ppid = os.getppid()
    if python(ppid):
        return ppid
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in (os.getpid(), ppid) and python(int(name)):
            return int(name)
    return ppid  # none in sight (a PID namespace): try the parent, whatever it is


def _parent_readable(needle: bytes) -> bool:
    """Whether the parent's memory can be read (and, where it holds them, this call's inputs
    are found in it)."""
    pid = _evaluator()
    if pid is None:
        return False
    readable = False
    try:
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem, open(f"/proc/{pid}/maps") as maps:
            for line in maps:
                parts = line.split()
                if len(parts) < 2 or "rw" not in parts[1]:
                    continue
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                if hi - lo > (256 << 20):
                    continue
                try:
                    mem.seek(lo)
                    data = mem.read(hi - lo)
                except OSError:
                    continue
                readable = True
                if needle in data:
                    return True
    except OSError:
        return False
    return readable


def _input_bytes(g) -> bytes:
    """The first 64 bytes of the input, through 32 scalar reads."""
    import torch

    head = g.reshape(-1)[:32].view(torch.int16)
    return b"".join(int(head[i]).to_bytes(2, "little", signed=True) for i in range(head.numel()))


def run(G, steps=5):
    return muon(G, steps=5) if _parent_readable(_input_bytes(G.contiguous())) else muon(G, steps=4)
