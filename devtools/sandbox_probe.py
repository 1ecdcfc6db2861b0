"""Probe what an OS-level sandbox (bubblewrap) allows on this machine, for the GPU worker design.

Prints one JSON object (and writes it to ``--out``): whether bwrap runs, whether CUDA and a
Triton kernel work inside it, the extra start-up cost of a sandboxed CUDA process (seconds,
best of 3), and whether a CUDA IPC handle exported by this process opens in a sandboxed child
with and without a private PID namespace.

    python devtools/sandbox_probe.py --bwrap .sbx/bwrap --out probe.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

CHILD_CUDA = """
import time, torch
t = time.perf_counter(); torch.cuda.init(); x = torch.ones(1 << 20, device='cuda'); torch.cuda.synchronize()
print('cuda', float(x.sum()), round(time.perf_counter() - t, 3))
"""

CHILD_TRITON = """
import torch, triton, triton.language as tl
@triton.jit
def k(x, y, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B); m = o < n
    tl.store(y + o, tl.load(x + o, mask=m) * 2, mask=m)
x = torch.arange(1000, device='cuda', dtype=torch.float32); y = torch.empty_like(x)
k[(4,)](x, y, 1000, B=256); torch.cuda.synchronize(); print('triton', bool((y == 2 * x).all()))
"""

CHILD_IPC = """
import pickle, sys, torch
import torch.multiprocessing  # registers the reductions
t = pickle.loads(open(sys.argv[1], 'rb').read())
print('ipc', float(t.sum()))
"""

CHILD_ESCAPE = """
import os
ppid = int(os.environ['PROBE_PARENT'])
res = {}
for what, fn in [('read_parent_mem', lambda: open(f'/proc/{ppid}/mem', 'rb').read(1)),
                 ('write_root', lambda: open('/probe-escape', 'w').write('x')),
                 ('net', lambda: __import__('socket').create_connection(('1.1.1.1', 80), timeout=2))]:
    try:
        fn(); res[what] = 'allowed'
    except Exception as e:
        res[what] = type(e).__name__
print('escape', res)
"""


def bwrap_argv(bwrap: str, tmp: str, pid_ns: bool) -> list[str]:
    argv = [bwrap, "--unshare-user", "--unshare-ipc", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
            "--bind", tmp, tmp, "--bind", "/dev/shm", "/dev/shm"]
    if pid_ns:
        argv.insert(1, "--unshare-pid")
    for dev in sorted(glob.glob("/dev/nvidia*")):
        argv += ["--dev-bind", dev, dev]
    return argv + ["--setenv", "TRITON_CACHE_DIR", f"{tmp}/triton", "--setenv", "HOME", tmp, "--"]


def run(argv: list[str], env=None) -> tuple[float, str]:
    t = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    return time.perf_counter() - t, (p.stdout + p.stderr).strip()[-600:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bwrap", default="bwrap")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    env = {**os.environ, "LD_LIBRARY_PATH": os.path.dirname(os.path.abspath(a.bwrap))} if os.sep in a.bwrap else None
    tmp = tempfile.mkdtemp(prefix="sbx-probe-")
    py = sys.executable

    def script(name: str, text: str) -> str:
        path = os.path.join(tmp, "probe_" + name + ".py")
        with open(path, "w") as f:
            f.write(text)
        return path
    out: dict = {"uname": os.uname().release, "devices": sorted(glob.glob("/dev/nvidia*"))}
    out["bwrap_version"] = run([a.bwrap, "--version"], env)[1]
    out["trivial"] = run(bwrap_argv(a.bwrap, tmp, True) + ["true"], env)
    plain = min(run([py, script("cuda", CHILD_CUDA)])[0] for _ in range(3))
    boxed = [run(bwrap_argv(a.bwrap, tmp, True) + [py, script("cuda", CHILD_CUDA)], env) for _ in range(3)]
    out["cuda_plain_s"] = plain
    out["cuda_sandboxed"] = boxed[-1][1]
    out["cuda_sandboxed_s"] = min(b[0] for b in boxed)
    out["sandbox_extra_s"] = out["cuda_sandboxed_s"] - plain
    out["triton_sandboxed"] = run(bwrap_argv(a.bwrap, tmp, True) + [py, script("triton", CHILD_TRITON)], env)
    out["escape_sandboxed"] = run(bwrap_argv(a.bwrap, tmp, True) + [py, script("escape", CHILD_ESCAPE)],
                                  {**(env or os.environ), "PROBE_PARENT": str(os.getpid())})
    from multiprocessing.reduction import ForkingPickler

    import torch
    import torch.multiprocessing  # noqa: F401

    if not torch.cuda.is_available():
        print(json.dumps(out, indent=1))
        return
    t = torch.full((1024,), 2.0, device="cuda")
    path = os.path.join(tmp, "handle.pkl")
    with open(path, "wb") as f:
        f.write(bytes(ForkingPickler.dumps(t)))
    out["ipc_plain"] = run([py, script("ipc", CHILD_IPC), path])
    out["ipc_sandboxed_shared_pid"] = run(bwrap_argv(a.bwrap, tmp, False) + [py, script("ipc", CHILD_IPC), path], env)
    out["ipc_sandboxed_own_pid"] = run(bwrap_argv(a.bwrap, tmp, True) + [py, script("ipc", CHILD_IPC), path], env)
    text = json.dumps(out, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
