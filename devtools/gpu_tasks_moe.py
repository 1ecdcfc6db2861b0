"""H200 run for the MoE / quantisation tasks: moe_align_block_size, fused_moe_bf16,
per_token_group_quant_fp8 (self-contained; the lead runs it, results go to $OUT).

For each task:

1. ``evaluate`` (the real harness, integrity on) of ``expert`` and of ``straightforward``
   against the ``reference`` baseline on every registered workload (the adversarial
   correctness-only workloads are checked, not timed);
2. ``torch.compile`` of the reference, timed in-process with the harness's own timers and the
   workload's timing mode (what a user would pick instead of writing kernels);
3. a table per workload: status, expert / straightforward / compile / eager-reference ms,
   expert-vs-compile and expert-vs-straightforward ratios, achieved TB/s and TFLOP/s of the
   expert against the minimal work (the task's SOL floor variant) and the measured H200
   ceilings (4.3 TB/s, 790 TFLOP/s bf16; latency class: 5 us launch floor), and whether the
   bar is met: memory bound >= 70 % of 4.3 TB/s, compute bound >= 50 % of 790 TFLOP/s,
   latency class <= 3x the launch floor, expert faster than straightforward.

Diagnostics that need no harness (direct calls, checked with the task's own checks):

* step ``align`` (default on): moe_align_block_size's expert schedules (one program, one
  launch with the grid barrier, two launches) on every registered workload: property check
  and CUDA-graph time. If ``fused`` fails or is slower than ``two_phase``, set
  ``GRID_SYNC = False`` in solutions/expert.py.
* step ``sweep`` (or ``--sweep``): a small tile sweep of the fused_moe and quant experts per workload (correctness
  against the reference, CUDA-event or graph time) to update their config tables.

Usage (repo root, one H200)::

    PYTHONPATH=src python devtools/gpu_tasks_moe.py [--tasks a,b] [--steps eval,compile,align,sweep]
        [--out DIR] [--fresh]

Each invocation merges its results into ``gpu_tasks_moe.json`` (so the work can be split into
calls that each fit a time limit) and prints the table of everything measured so far.
``--cpu-smoke`` runs the same logic on the CPU smoke workloads (a dry run; numbers meaningless).

Writes ``$OUT/gpu_tasks_moe.json`` (or ``--out``) after every task, and the log next to it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from d2kbench.harness import timing  # noqa: E402
from d2kbench.harness.env import fingerprint  # noqa: E402
from d2kbench.harness.evaluate import Options, evaluate  # noqa: E402
from d2kbench.harness.inputs import args_nbytes, make_args, secret_seed  # noqa: E402
from d2kbench.tasks import load_task  # noqa: E402
from d2kbench.tasks.formula import evaluate_formula  # noqa: E402
from d2kbench.tasks.loader import import_file  # noqa: E402

TASKS = ("moe_align_block_size", "per_token_group_quant_fp8", "fused_moe_bf16")
BW = 4.3e12          # measured HBM copy bandwidth, B/s
PEAK_TC = 790e12     # measured bf16 dense, FLOP/s
PEAK_FP32 = 60e12
LAUNCH_FLOOR_MS = 0.005
LOG = None
#: "cuda" for the real run; "cpu" with --cpu-smoke (smoke workloads, interpreter, CPU timer):
#: a dry run of this script's own logic, not a measurement.
DEVICE = "cuda"


def workloads_of(task) -> list:
    return list(task.spec.workloads if DEVICE == "cuda" else task.spec.smoke_workloads)


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def log(*a) -> None:
    msg = " ".join(str(x) for x in a)
    print(msg, flush=True)
    if LOG is not None:
        LOG.write(msg + "\n")
        LOG.flush()


# ---------------------------------------------------------------------------------------------
# roofline of one workload from the task's minimal-work (SOL floor) counts
# ---------------------------------------------------------------------------------------------
def roofline(spec, wl) -> dict:
    c = spec.sol.counts(spec.sol.floor)
    flops = evaluate_formula(c.tc_flops, wl.axes)
    fp32 = evaluate_formula(c.fp32_flops, wl.axes)
    nbytes = evaluate_formula(c.bytes, wl.axes)
    t_mem, t_tc, t_fp32 = nbytes / BW, flops / PEAK_TC, fp32 / PEAK_FP32
    sol_ms = 1e3 * max(t_mem, t_tc, t_fp32)
    if sol_ms < LAUNCH_FLOOR_MS:
        regime = "latency"
    else:
        regime = "compute" if t_tc >= max(t_mem, t_fp32) else "memory"
    return {"flops": flops, "bytes": nbytes, "sol_ms": sol_ms, "regime": regime, "work_model": spec.sol.floor}


def bar(regime: str, roof: dict, ms: float | None) -> tuple[bool | None, str]:
    """Whether a time meets the lead's bar for its regime, and the achieved figure."""
    if ms is None:
        return None, "-"
    s = ms / 1e3
    if regime == "latency":
        return ms <= 3 * LAUNCH_FLOOR_MS, f"{ms / LAUNCH_FLOOR_MS:.1f}x floor"
    if regime == "memory":
        tbs = roof["bytes"] / s / 1e12
        return tbs >= 0.7 * BW / 1e12, f"{tbs:.2f} TB/s ({100 * tbs * 1e12 / BW:.0f}%)"
    tfs = roof["flops"] / s / 1e12
    return tfs >= 0.5 * PEAK_TC / 1e12, f"{tfs:.0f} TFLOP/s ({100 * tfs * 1e12 / PEAK_TC:.0f}%)"


# ---------------------------------------------------------------------------------------------
# timing of a plain callable with the harness's timers (compiled reference, diagnostics)
# ---------------------------------------------------------------------------------------------
def _input_sets(ref, spec, wl, mode: str) -> list[list]:
    first = make_args(ref, spec, wl, secret_seed(), DEVICE)
    if DEVICE == "cpu":
        n = 1
    elif mode == "graph":
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        n = int(min(256, max(1, -(-3 * l2 // max(1, args_nbytes(first))))))
    else:
        n = 2
    return [first] + [make_args(ref, spec, wl, secret_seed(), DEVICE) for _ in range(n - 1)]


def time_callable(fn, sets: list[list], mode: str) -> dict:
    def call(i):
        return fn(*sets[i])

    for i in range(min(2, len(sets))):
        call(i)
    sync()
    if DEVICE == "cpu":
        return timing.time_cpu(call, len(sets), samples=2).model_dump()
    if mode == "graph":
        try:
            return timing.time_graph(call, len(sets)).model_dump()
        except Exception as e:  # noqa: BLE001 - e.g. a compiled function that is not capturable
            log(f"      graph capture failed ({type(e).__name__}: {str(e)[:160]}); timing with events")
            torch.cuda.synchronize()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    buf = torch.empty(max(2 * l2, 128 << 20), dtype=torch.uint8, device="cuda")
    return timing.time_events(call, len(sets), flush=buf.zero_).model_dump()


# ---------------------------------------------------------------------------------------------
def eval_solution(task, solution: str) -> dict:
    t0 = time.time()
    ev = evaluate(task, solution, workloads_of(task), device=DEVICE, baseline="reference", options=Options(),
                  progress=lambda m: log(f"    [{solution}] {m}"))
    out = {"geomean_speedup_vs_reference": ev.geomean_speedup, "wall_s": time.time() - t0, "workloads": {}}
    base = {r.workload: r for r in (ev.baseline.results if ev.baseline else [])}
    for r in ev.candidate.results:
        b = base.get(r.workload)
        out["workloads"][r.workload] = {
            "status": r.status.value, "cause": r.cause[:400],
            "violations": [v.model_dump() for v in r.violations][:4],
            "mean_ms": r.timing.mean_ms if r.timing else None,
            "median_ms": r.timing.median_ms if r.timing else None,
            "ci95_ms": [r.timing.ci95_low_ms, r.timing.ci95_high_ms] if r.timing else None,
            "timing_mode": r.timing.mode if r.timing else None,
            "reference_ms": b.timing.mean_ms if b and b.timing else None,
            "reference_status": b.status.value if b else None,
        }
    log(f"    [{solution}] geomean speedup vs reference: {ev.geomean_speedup}  ({time.time() - t0:.0f} s)")
    return out


def compile_reference(task, workloads) -> dict:
    import torch._dynamo

    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 256)
    ref = task.reference_module()
    fn = torch.compile(ref.run, dynamic=False)
    res = {}
    for wl in workloads:
        mode = task.spec.timing_for(wl).mode
        t0 = time.time()
        try:
            sets = _input_sets(ref, task.spec, wl, mode)
            fn(*sets[0])
            sync()
            compile_s = time.time() - t0
            st = time_callable(fn, sets, mode)
            res[wl.id] = {"mean_ms": st["mean_ms"], "median_ms": st["median_ms"], "mode": st["mode"],
                          "compile_s": compile_s}
            log(f"    [compile] {wl.id}: {st['mean_ms']:.4f} ms ({st['mode']}, first call {compile_s:.1f} s)")
            del sets
        except Exception as e:  # noqa: BLE001
            res[wl.id] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            log(f"    [compile] {wl.id}: FAILED {type(e).__name__}: {str(e)[:300]}")
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    return res


# ---------------------------------------------------------------------------------------------
# diagnostics
# ---------------------------------------------------------------------------------------------
def align_modes(task) -> dict:
    ref = task.reference_module()
    ex = import_file(task.root / "solutions" / "expert.py", "gpu_moe_align_expert")
    res = {}
    for wl in workloads_of(task):
        n = wl.axes["T"] * wl.axes["k"]
        modes = ["fused", "two_phase"] + (["single"] if n <= 8192 else [])
        res[wl.id] = {}
        for mode in modes:
            try:
                args = make_args(ref, task.spec, wl, secret_seed(), DEVICE)
                if mode == "fused" and DEVICE == "cpu":  # the interpreter runs programs one by one
                    outs = ex.align(*args, mode, 1)
                    ok, _, detail = ref.check(args, list(outs))
                    res[wl.id][mode] = {"check": ok, "detail": detail, "programs": 1}
                    log(f"    [align {mode}] {wl.id}: check {ok} (one program on the CPU)")
                    continue
                t0 = time.time()
                outs = ex.align(*args, mode)
                sync()
                first_s = time.time() - t0
                ok, bad, detail = ref.check(args, list(outs))
                entry = {"check": ok, "detail": detail[:200], "first_call_s": first_s}
                if ok and not wl.correctness_only:
                    sets = _input_sets(ref, task.spec, wl, "graph")
                    entry["mean_ms"] = time_callable(lambda *a, m=mode: ex.align(*a, m), sets, "graph")["mean_ms"]
                res[wl.id][mode] = entry
                log(f"    [align {mode}] {wl.id}: check {ok} {detail[:120]} "
                    f"{entry.get('mean_ms', float('nan')):.4f} ms (first call {first_s:.2f} s)")
            except Exception as e:  # noqa: BLE001
                res[wl.id][mode] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                log(f"    [align {mode}] {wl.id}: FAILED {type(e).__name__}: {str(e)[:300]}")
    return res


def _rel_fro(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def sweep_fused_moe(task) -> dict:
    ref = task.reference_module()
    ex = import_file(task.root / "solutions" / "expert.py", "gpu_fused_moe_expert")
    sms = torch.cuda.get_device_properties(0).multi_processor_count if DEVICE == "cuda" else 4
    res = {}
    for wl in [w for w in workloads_of(task) if not w.correctness_only]:
        a = wl.axes
        base = ex.config_for(a["T"], a["H"], a["I"], a["E"], a["k"], sms)
        r = dataclasses.replace
        if base.swap:
            cands = [base, r(base, bk=64), r(base, bk=256, stages=3), r(base, stages=3), r(base, stages=5),
                     r(base, warps=8), r(base, bn1=max(16, base.bn1 // 2)), r(base, bn2=max(16, base.bn2 // 2)),
                     r(base, bn1=min(64, base.bn1 * 2)), r(base, bn2=min(128, base.bn2 * 2))]
        else:
            cands = [base, r(base, stages=3), r(base, bk=128, stages=3), r(base, bn2=256, stages=3),
                     r(base, bn1=128, stages=3), r(base, warps=4), r(base, group_m=16), r(base, group_m=1),
                     r(base, block_m=64, warps=4)]
        mode = task.spec.timing_for(wl).mode
        sets = _input_sets(ref, task.spec, wl, mode)
        want = ref.run(*sets[0])
        res[wl.id] = []
        for cfg in dict.fromkeys(cands):
            try:
                err = _rel_fro(ex.fused_moe(*sets[0], cfg), want)
                ms = time_callable(lambda *x, c=cfg: ex.fused_moe(*x, c), sets, mode)["mean_ms"]
                res[wl.id].append({"config": dataclasses.asdict(cfg), "rel_fro": err, "mean_ms": ms})
                log(f"    [sweep] {wl.id} {cfg}: {ms:.4f} ms rel_fro {err:.2e}")
            except Exception as e:  # noqa: BLE001
                res[wl.id].append({"config": dataclasses.asdict(cfg), "error": f"{type(e).__name__}: {str(e)[:200]}"})
                log(f"    [sweep] {wl.id} {cfg}: FAILED {type(e).__name__}: {str(e)[:200]}")
        del sets, want
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    return res


def sweep_quant(task) -> dict:
    ref = task.reference_module()
    ex = import_file(task.root / "solutions" / "expert.py", "gpu_quant_expert")
    res = {}
    tiles = [(32, 4, 8), (64, 2, 8), (16, 4, 4), (32, 2, 4), (64, 4, 8), (128, 1, 8), (32, 8, 8), (8, 8, 4)]
    if DEVICE == "cpu":
        tiles = [(8, 2, 1), (16, 1, 1)]
    for wl in [w for w in workloads_of(task) if not w.correctness_only]:
        sets = _input_sets(ref, task.spec, wl, "graph")
        want_q, want_s = ref.run(*sets[0])
        res[wl.id] = []
        for bm, gpp, warps in tiles:
            try:
                q, s = ex.quantize(*sets[0], bm, gpp, warps)
                ok = bool(torch.equal(s, want_s)) or float(((s - want_s).abs() / want_s).max()) <= 1e-6
                diff = float((q.view(torch.uint8) != want_q.view(torch.uint8)).float().mean())
                ms = time_callable(lambda *x, c=(bm, gpp, warps): ex.quantize(*x, *c), sets, "graph")["mean_ms"]
                res[wl.id].append({"bm": bm, "gpp": gpp, "warps": warps, "scales_ok": ok, "code_diff": diff, "mean_ms": ms})
                log(f"    [sweep] {wl.id} bm={bm} gpp={gpp} warps={warps}: {ms:.4f} ms scales_ok={ok} codes_diff={diff:.1e}")
            except Exception as e:  # noqa: BLE001
                log(f"    [sweep] {wl.id} bm={bm} gpp={gpp} warps={warps}: FAILED {type(e).__name__}: {str(e)[:200]}")
        del sets
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    return res


# ---------------------------------------------------------------------------------------------
def table(task, data: dict) -> list[dict]:
    rows = []
    ex = data.get("expert", {}).get("workloads", {})
    sf = data.get("straightforward", {}).get("workloads", {})
    cp = data.get("compile", {})
    for wl in workloads_of(task):
        e, s, c = ex.get(wl.id, {}), sf.get(wl.id, {}), cp.get(wl.id, {})
        roof = roofline(task.spec, wl)
        em, sm, cm = e.get("mean_ms"), s.get("mean_ms"), c.get("mean_ms")
        ok_bar, achieved = bar(roof["regime"], roof, em)
        row = {
            "task": task.id, "workload": wl.id, "correctness_only": wl.correctness_only,
            "timing_mode": task.spec.timing_for(wl).mode, "regime": roof["regime"], "sol_ms": roof["sol_ms"],
            "expert_status": e.get("status"), "straightforward_status": s.get("status"),
            "expert_ms": em, "straightforward_ms": sm, "compile_ms": cm, "reference_ms": e.get("reference_ms"),
            "expert_over_compile": (cm / em) if em and cm else None,
            "expert_over_straightforward": (sm / em) if em and sm else None,
            "achieved": achieved, "meets_bar": ok_bar,
            "beats_straightforward": (em < sm) if em and sm else None,
        }
        rows.append(row)
    return rows


def fmt(v, spec="{:.4f}") -> str:
    return "-" if v is None else spec.format(v)


def print_table(rows: list[dict]) -> None:
    head = (f"{'task':<26} {'workload':<32} {'exp':<6} {'sf':<6} {'expert ms':>10} {'straight ms':>11} "
            f"{'compile ms':>10} {'ref ms':>9} {'cmp/exp':>8} {'sf/exp':>7}  {'regime':<8} {'achieved':<24} bar")
    log(head)
    log("-" * len(head))
    for r in rows:
        if r["correctness_only"]:
            log(f"{r['task']:<26} {r['workload']:<32} {str(r['expert_status']):<6} {str(r['straightforward_status']):<6} "
                f"{'(correctness only)':>10}")
            continue
        log(f"{r['task']:<26} {r['workload']:<32} {str(r['expert_status']):<6} {str(r['straightforward_status']):<6} "
            f"{fmt(r['expert_ms']):>10} {fmt(r['straightforward_ms']):>11} {fmt(r['compile_ms']):>10} "
            f"{fmt(r['reference_ms'], '{:.3f}'):>9} {fmt(r['expert_over_compile'], '{:.1f}x'):>8} "
            f"{fmt(r['expert_over_straightforward'], '{:.2f}x'):>7}  {r['regime']:<8} {r['achieved']:<24} "
            f"{'OK' if r['meets_bar'] else ('MISS' if r['meets_bar'] is False else '-')}")


STEPS = ("eval", "compile", "align", "sweep")


def main() -> int:
    global LOG, DEVICE
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--steps", default="eval,compile,align",
                    help=f"comma list of {STEPS}: harness evaluations, torch.compile of the references, "
                         "the align schedules, the tile sweeps (fused_moe, quant)")
    ap.add_argument("--sweep", action="store_true", help="same as adding 'sweep' to --steps")
    ap.add_argument("--out", default=os.environ.get("OUT", "results/gpu_tasks_moe"))
    ap.add_argument("--fresh", action="store_true", help="start a new JSON instead of merging into an existing one")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="dry run of this script on the CPU (smoke workloads, Triton interpreter); numbers are meaningless")
    args = ap.parse_args()
    steps = {x for x in args.steps.split(",") if x} | ({"sweep"} if args.sweep else set())
    if steps - set(STEPS):
        ap.error(f"unknown steps {sorted(steps - set(STEPS))}")
    if args.cpu_smoke:
        DEVICE = "cpu"
        os.environ["TRITON_INTERPRET"] = "1"
    elif not torch.cuda.is_available():
        print("no GPU visible", file=sys.stderr)
        return 2
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    LOG = open(out_dir / "gpu_tasks_moe.log", "a")
    path = out_dir / "gpu_tasks_moe.json"
    doc = {}
    if path.is_file() and not args.fresh:  # several invocations (e.g. one per task) build one document
        try:
            doc = json.loads(path.read_text())
        except ValueError:
            doc = {}
    doc.setdefault("tasks", {})
    doc.setdefault("rows", [])
    doc.setdefault("runs", []).append({"started": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv[1:]})
    doc["env"] = fingerprint(DEVICE)
    doc["ceilings"] = {"hbm_Bps": BW, "bf16_flops": PEAK_TC, "launch_floor_ms": LAUNCH_FLOOR_MS}

    def save() -> None:
        path.write_text(json.dumps(doc, indent=1, default=str))

    log(f"== gpu_tasks_moe on {torch.cuda.get_device_name(0) if DEVICE == 'cuda' else 'CPU (dry run)'}, "
        f"torch {torch.__version__}, steps {sorted(steps)}")
    for tid in [t for t in args.tasks.split(",") if t]:
        task = load_task(tid)
        log(f"== {tid}")
        data = doc["tasks"].setdefault(tid, {})
        if "eval" in steps:
            for sol in ("expert", "straightforward"):
                try:
                    data[sol] = eval_solution(task, sol)
                except Exception:  # noqa: BLE001
                    data[sol] = {"error": traceback.format_exc()[-2000:]}
                    log(f"    [{sol}] FAILED\n{data[sol]['error']}")
                save()
        if "compile" in steps:
            try:
                data["compile"] = compile_reference(task, [w for w in workloads_of(task) if not w.correctness_only])
            except Exception:  # noqa: BLE001
                data["compile"] = {"error": traceback.format_exc()[-2000:]}
                log(f"    [compile] FAILED\n{data['compile']['error']}")
            save()
        if "align" in steps and tid == "moe_align_block_size":
            data["align_modes"] = align_modes(task)
        if "sweep" in steps and tid == "fused_moe_bf16":
            data["sweep"] = sweep_fused_moe(task)
        if "sweep" in steps and tid == "per_token_group_quant_fp8":
            data["sweep"] = sweep_quant(task)
        doc["rows"] = [r for r in doc["rows"] if r["task"] != tid] + table(task, data)
        save()
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    log("")
    print_table(doc["rows"])
    misses = [r for r in doc["rows"] if not r["correctness_only"] and (r["meets_bar"] is False or r["beats_straightforward"] is False)]
    fails = [r for r in doc["rows"] if r["expert_status"] != "ok" or r["straightforward_status"] != "ok"]
    log(f"\n{len(fails)} workload(s) with a failed or missing solution result, {len(misses)} timed workload(s) "
        f"missing a bar; JSON: {path}")
    doc["runs"][-1]["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    save()
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
