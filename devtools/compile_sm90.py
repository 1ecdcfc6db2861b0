"""Compile every Triton kernel a solution launches for the H200 (sm_90), on a machine without a GPU.

The CPU interpreter (``TRITON_INTERPRET=1``) accepts code the real compiler rejects
(non-constexpr globals, ...) and computes some things differently (``x / y`` is IEEE there,
``div.full.f32`` on the GPU). This script runs each solution's host code with the interpreter
OFF and a stand-in driver whose target is ``cuda:90`` (``d2kbench.integrity.sm90_aot``): every ``kernel[grid](...)`` launch is
compiled ahead of time (front end, TTGIR, LLVM, PTX and ``ptxas`` to a cubin, exactly what the
H200 would compile) but nothing runs. Autotuned kernels compile every config that survives
the kernel's pruning. The tensors are real (CPU) inputs from the task's ``make_inputs`` so the
host code picks the same tiles as on the GPU (helpers named ``_sm_count``/``_num_sms`` are made
to answer 132, the H200's SM count).

Per compiled kernel it reports warps, stages, shared memory, registers and stack/local memory
(spills) from the cubin, and flags:

* compile errors (with Triton's message);
* shared memory above the sm_90 opt-in limit (232448 bytes) or registers x threads above the
  65536-register file: ``OutOfResources`` at launch on the GPU (the autotuner silently drops
  such configs: wasted compile time);
* grid dimensions above the CUDA limits (y, z <= 65535);
* with ``--div``: ``div.full.f32`` in the PTX (informational: Triton's ``/`` on fp32 is the
  approximate full-range division, up to 2 ulp, where the interpreter divides exactly; use
  ``tl.div_rn`` where a result must be bit-exact).

Usage (repo root; no GPU needed, a few minutes per task on two cores)::

    PYTHONPATH=src python devtools/compile_sm90.py [TASK ...] [-s expert -s straightforward]
        [--workloads registered|smoke|all] [--only WORKLOAD_ID] [--div]

Exit status 1 if anything was flagged as an error.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from d2kbench.checking.inputs import make_args  # noqa: E402
from d2kbench.integrity.sm90_aot import install_sm90_driver, record_launches  # noqa: E402
from d2kbench.tasks import load_task  # noqa: E402
from d2kbench.tasks.loader import import_file, list_tasks  # noqa: E402

H200_SMS = 132
SMEM_LIMIT = 232448          # sm_90 max dynamic shared memory per block (opt-in)
REGS_PER_SM = 65536

#: One record per launch since the last clear (``d2kbench.integrity.sm90_aot.record_launches``).
LAUNCHES: list[dict] = []


def install() -> None:
    """The stand-in sm_90 driver, the interpreter off, every launch compiled into ``LAUNCHES``
    (call before anything imports triton)."""
    install_sm90_driver()
    record_launches(LAUNCHES)


def _cuobjdump() -> Path:
    import triton  # noqa: PLC0415 - after install(): imported with the interpreter off

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def _resources(kernel) -> dict:
    out = {"shared": kernel.metadata.shared, "warps": kernel.metadata.num_warps,
           "stages": kernel.metadata.num_stages}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        text = subprocess.run([str(_cuobjdump()), "--dump-resource-usage", f.name], capture_output=True,
                              text=True).stdout
    for line in text.splitlines():
        if "REG:" in line:
            for tok in line.split():
                k, _, v = tok.partition(":")
                if k in ("REG", "LOCAL", "STACK"):
                    out[k.lower()] = int(v)
    ptx = kernel.asm.get("ptx", "")
    out["div_full"] = ptx.count("div.full.f32")
    return out


def _problems(rec: dict, res: dict, show_div: bool = False) -> tuple[list[str], list[str]]:
    errors, notes = [], []
    if res["shared"] > SMEM_LIMIT:
        errors.append(f"shared memory {res['shared']} B > {SMEM_LIMIT} (OutOfResources at launch)")
    threads = res["warps"] * 32
    if res.get("reg", 0) * threads > REGS_PER_SM:
        errors.append(f"{res['reg']} registers x {threads} threads > {REGS_PER_SM}")
    spill = max(res.get("local", 0), res.get("stack", 0))  # ptxas books register spills under STACK
    if spill:
        notes.append(f"{spill} B stack/local memory (register spills)")
    if show_div and res.get("div_full"):
        notes.append(f"{res['div_full']} x div.full.f32 (approximate fp32 '/')")
    g = rec.get("grid")
    if isinstance(g, tuple):
        if len(g) > 1 and g[1] > 65535 or len(g) > 2 and g[2] > 65535 or g and g[0] > 2**31 - 1:
            errors.append(f"grid {g} exceeds CUDA limits")
        if any(x <= 0 for x in g):
            notes.append(f"empty grid {g}")
    return errors, notes


def _patch_sm_count(module) -> None:
    for name in ("_sm_count", "_num_sms"):
        if callable(getattr(module, name, None)):
            setattr(module, name, lambda *a, **k: H200_SMS)


def run_one(task, sol_name: str, workloads, verbose: bool, show_div: bool = False) -> int:
    path = task.resolve_solution(sol_name)
    reference = task.reference_module()
    n_err = 0
    try:
        module = import_file(path)
    except Exception as e:  # noqa: BLE001
        print(f"  IMPORT ERROR {type(e).__name__}: {e}")
        return 1
    _patch_sm_count(module)
    seen: dict[int, dict] = {}
    for wl in workloads:
        t0 = time.time()
        args = make_args(reference, task.spec, wl, 1234, "cpu")
        LAUNCHES.clear()
        try:
            module.run(*args)
        except Exception as e:  # noqa: BLE001
            # the first compile error is already recorded; anything else is a host-code failure
            if not any("error" in r for r in LAUNCHES):
                print(f"  {wl.id}: HOST ERROR {type(e).__name__}: {e}")
                if verbose:
                    traceback.print_exc()
                n_err += 1
        del args
        lines = []
        for rec in LAUNCHES:
            if "error" in rec:
                n_err += 1
                lines.append(f"    ERROR {rec['kernel']} {rec['consts']} {rec['options']}: {rec['error'][:2000]}")
                continue
            k = rec["compiled"]
            res = seen.get(id(k)) or _resources(k)
            seen[id(k)] = res
            errors, notes = _problems(rec, res, show_div)
            n_err += len(errors)
            flag = "ERROR" if errors else ("note " if notes else "ok   ")
            lines.append(f"    {flag} {rec['kernel']} grid={rec['grid']} consts={rec['consts']} "
                         f"warps={res['warps']} stages={res['stages']} smem={res['shared']} "
                         f"regs={res.get('reg')} local={res.get('local')} stack={res.get('stack')}"
                         + ("".join(f"\n        ! {p}" for p in errors + notes)))
        print(f"  {wl.id} ({time.time() - t0:.0f} s, {len(LAUNCHES)} compiles/launches)")
        # dedupe identical lines (autotune loops, repeated launches)
        for line in dict.fromkeys(lines):
            print(line)
        sys.stdout.flush()
    return n_err


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tasks", nargs="*", help="task ids (default: all)")
    ap.add_argument("-s", "--solution", action="append", help="solution names (default expert, straightforward)")
    ap.add_argument("--workloads", default="registered", choices=["registered", "smoke", "all"])
    ap.add_argument("--only", action="append", help="workload ids")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--div", action="store_true", help="note approximate fp32 divisions (div.full.f32)")
    a = ap.parse_args()
    install()
    tasks = a.tasks or list_tasks()
    total = 0
    for tid in tasks:
        task = load_task(tid)
        wls = {"registered": list(task.spec.workloads), "smoke": list(task.spec.smoke_workloads),
               "all": list(task.spec.workloads) + list(task.spec.smoke_workloads)}[a.workloads]
        if a.only:
            wls = [w for w in wls if w.id in a.only]
        for sol in a.solution or ["expert", "straightforward"]:
            print(f"== {tid} / {sol}")
            t0 = time.time()
            n = run_one(task, sol, wls, a.verbose, a.div)
            print(f"== {tid} / {sol}: {n} error(s), {time.time() - t0:.0f} s")
            total += n
    print(f"TOTAL errors: {total}")
    return 1 if total else 0


if __name__ == "__main__":
    raise SystemExit(main())
