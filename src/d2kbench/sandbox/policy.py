"""The sandbox policies of the project: what a solution worker and an agent may see and touch.

Both start from the same read-only runtime (:func:`runtime_paths`): the system folders
(``/usr``, ``/etc``, ``/sys``, the ``/bin``-style links), the Python installation and its
import path, and the harness package with the suite's folder hidden. Then:

* a **solution worker** (:func:`worker_policy`) sees its task's public files (``task.yaml``,
  ``reference.py``, the declared alternatives), the staged copy of its own code, and can write
  only its private folder (temp files, ``HOME``) and its compile cache; on the GPU it gets the
  NVIDIA device nodes and the shared ``/dev/shm`` that CUDA IPC's reference counters live in;
  no network.
* an **agent** (:func:`agent_policy`) sees its workspace (writable) and the runtime its tools
  need, never the suite's held-back files, other tasks, the results store or the project; its
  tools reach the trusted evaluator through the workspace's request folder. Network only where
  the backend needs its model endpoint.

Everything else, the home folder, the project checkout, the results store, other processes,
is simply not there.
"""

from __future__ import annotations

import glob
import os
import shutil
import site
import sys
import sysconfig
from pathlib import Path

from d2kbench.sandbox.bwrap import Policy

#: System folders every sandbox sees read-only (those that exist; links stay links).
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/sys")
#: Environment variables passed into a sandbox (exact names), and prefixes of passed names.
ENV_KEEP = ("PATH", "LD_LIBRARY_PATH", "LANG", "LANGUAGE", "TZ", "PYTHONHASHSEED", "PYTHONUNBUFFERED",
            "PYTHONDONTWRITEBYTECODE", "PYTHONPATH", "COLUMNS")
ENV_KEEP_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "TRITON_", "PYTORCH_", "TORCH_", "OMP_", "MKL_", "KMP_",
                     "NCCL_", "NVSHMEM_")
#: Variables never passed, whatever their prefix (credentials, redirections of caches we set).
ENV_DROP = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_HOME")
#: The harness package (``.../d2kbench``) and the suite folder inside it.
PACKAGE_DIR = Path(__file__).resolve().parents[1]
SUITE_DIR = PACKAGE_DIR / "suite"


def _existing(paths) -> list[str]:
    out, seen = [], set()
    for p in paths:
        if not p:
            continue
        p = os.path.abspath(p)
        if p not in seen and os.path.lexists(p):
            seen.add(p)
            out.append(p)
    return out


def _outermost(paths: list[str]) -> list[str]:
    """Drop paths inside other listed (non-link) folders: one bind covers them."""
    real = sorted(_existing(paths), key=len)
    out: list[str] = []
    for p in real:
        if not any(p == q or p.startswith(q.rstrip(os.sep) + os.sep) for q in out if not os.path.islink(q)):
            out.append(p)
    return out


def python_paths() -> list[str]:
    """The Python installation this process runs on: prefixes (a virtual environment and the
    interpreter it was made from), the standard library, ``site-packages``, the folders of
    ``PYTHONPATH`` and the folder of the interpreter binary (resolved through links)."""
    cfg = sysconfig.get_paths()
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, getattr(sys, "base_exec_prefix", None),
             *(cfg.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib", "include", "platinclude")),
             *getattr(site, "getsitepackages", lambda: [])(), os.path.dirname(os.path.realpath(sys.executable))]
    user_site = getattr(site, "getusersitepackages", lambda: None)()
    if user_site and os.path.isdir(user_site):
        paths.append(user_site)
    paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    paths += [p for p in sys.path if p and ("site-packages" in p or "dist-packages" in p)]
    return _existing(paths)


def runtime_paths() -> list[str]:
    """Read-only paths every sandbox needs: system folders, the Python installation and the
    harness package (whose suite folder :func:`hidden_paths` covers)."""
    return _outermost([*SYSTEM_PATHS, *python_paths(), str(PACKAGE_DIR)])


def hidden_paths() -> list[str]:
    """What is covered inside the visible runtime: the suite (its held-back solutions, rubrics
    and calibrations, and every other task)."""
    return [str(SUITE_DIR)] if SUITE_DIR.is_dir() else []


def gpu_devices() -> list[str]:
    """The NVIDIA device nodes (``/dev/nvidia0``, ``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ...)."""
    return sorted(glob.glob("/dev/nvidia*"))


def sandbox_env(home: str, extra: dict[str, str] | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment inside a sandbox: the allowed variables of ``base`` (default: this
    process's; credentials and everything else dropped), ``HOME``/``TMPDIR`` at ``home``,
    the import path of the harness package, then ``extra``."""
    base = dict(os.environ if base is None else base)
    env = {k: v for k, v in base.items()
           if k not in ENV_DROP and (k in ENV_KEEP or k.startswith(ENV_KEEP_PREFIXES))}
    pp = [str(PACKAGE_DIR.parent)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env.update({"HOME": home, "TMPDIR": home, "XDG_CACHE_HOME": os.path.join(home, ".cache"),
                "PYTHONPATH": os.pathsep.join(dict.fromkeys(pp)), "PYTHONNOUSERSITE": "1"})
    env.update(extra or {})
    return env


def task_public_paths(task_root: Path, files: tuple[str, ...]) -> list[str]:
    """The files of ``task_root`` a worker may read (those that exist)."""
    return _existing(str(Path(task_root) / f) for f in files)


def worker_policy(*, task_root: Path, task_files: tuple[str, ...], code: list[str], workdir: Path, cache_dir: Path,
                  device: str, parent_tmp: str | None, extra_env: dict[str, str] | None = None) -> Policy:
    """The sandbox of one solution worker.

    Args:
        task_root: the task folder; only ``task_files`` of it are visible.
        task_files: names (relative to ``task_root``) a worker reads: the spec, the reference,
            the alternatives' folder.
        code: further paths to show read-only: the solution's file where it is not a staged copy
            inside ``workdir`` (trusted code: the reference, an alternative).
        workdir: the worker's private folder (``HOME``, ``TMPDIR``, working directory): writable.
        cache_dir: the solution's compile cache (Triton, Inductor): writable.
        device: ``cuda`` adds the NVIDIA device nodes and ``/dev/shm`` (CUDA IPC reference counters).
        parent_tmp: the parent's multiprocessing folder (its fd-passing socket), read-only.
        extra_env: more environment variables inside.
    """
    ro = runtime_paths()
    if parent_tmp:
        ro.append(parent_tmp)
    exposed = task_public_paths(task_root, task_files)
    visible_code = [str(p) for p in code if not str(p).startswith(str(workdir) + os.sep)]
    dev = gpu_devices() + (["/dev/shm"] if os.path.isdir("/dev/shm") else []) if device == "cuda" else []
    env = sandbox_env(str(workdir), {"TRITON_CACHE_DIR": str(Path(cache_dir) / "triton"),
                                     "TORCHINDUCTOR_CACHE_DIR": str(Path(cache_dir) / "inductor"),
                                     **(extra_env or {})})
    return Policy(ro=ro, rw=[str(workdir), str(cache_dir)], hide=hidden_paths(), expose=exposed + visible_code,
                  dev=dev, env=env, chdir=str(workdir))


def agent_policy(*, workspace: Path, extra_ro: list[str] | None = None, extra_rw: list[str] | None = None,
                 env: dict[str, str] | None = None, share_net: bool = False, device: str = "cpu") -> Policy:
    """The sandbox of one agent process (a CLI agent and every tool it runs).

    Args:
        workspace: the agent's workspace (writable, the working directory).
        extra_ro: more read-only paths (the agent CLI's installation).
        extra_rw: more writable paths (the CLI's configuration folder).
        env: the complete environment inside (see :func:`sandbox_env`).
        share_net: keep the network (the model endpoint); default none.
        device: ``cuda`` adds the NVIDIA device nodes (profiling on the GPU stays with the
            trusted evaluator; the nodes let ``nvidia-smi`` answer).
    """
    ro = _outermost(runtime_paths() + [p for p in (extra_ro or []) if os.path.lexists(p)])
    dev = gpu_devices() if device == "cuda" else []
    return Policy(ro=ro, rw=_existing([str(workspace), *(extra_rw or [])]), hide=hidden_paths(), dev=dev,
                  env=dict(env or sandbox_env(str(workspace))), chdir=str(workspace), share_net=share_net)


def installation_paths(binary: str) -> list[str]:
    """What a command-line program needs to run besides the runtime: its resolved file and,
    for a Node.js package (``.../node_modules/<pkg>/...``), the package folder and the ``node``
    interpreter on PATH. Empty when ``binary`` is not found."""
    found = shutil.which(binary) or (binary if os.path.exists(binary) else None)
    if not found:
        return []
    real = os.path.realpath(found)
    out = [os.path.dirname(found), real]
    parts = Path(real).parts
    if "node_modules" in parts:
        i = len(parts) - 1 - parts[::-1].index("node_modules")
        pkg = Path(*parts[:i + 2]) if i + 1 < len(parts) and not parts[i + 1].startswith("@") else Path(*parts[:i + 3])
        out.append(str(pkg))
        node = shutil.which("node")
        if node:
            out += [node, os.path.realpath(node)]
    return _existing(out)
