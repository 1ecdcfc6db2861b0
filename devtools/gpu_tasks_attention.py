"""H200 calibration of the attention-family tasks: gqa_flash_prefill, paged_decode_gqa, kv_cache_fp8_store.

For every task and registered workload (correctness-only ones included):

1. ``evaluate(task, "expert")`` and ``evaluate(task, "straightforward")`` through the harness
   (``d2kbench.harness.evaluate.evaluate``: every check, integrity on, the task's timing mode,
   baseline = the PyTorch reference) -- what ``d2k eval TASK expert|straightforward`` does;
2. the alternative a user would pick, timed in this process with the harness's own timers
   (``time_events`` with an L2 flush for events-timed tasks, ``time_graph`` for graph-timed ones):
   * gqa_flash_prefill: ``F.scaled_dot_product_attention(is_causal=True, enable_gqa=True)`` under
     ``sdpa_kernel`` FLASH_ATTENTION and CUDNN_ATTENTION;
   * paged_decode_gqa: SDPA (EFFICIENT / CUDNN, boolean key mask) on the pages gathered into a
     dense ``[B, Hkv, MAXB*BS, D]`` cache, timed with the gather excluded (``pregathered``: the
     most favourable case for the alternative) and included (``gather+``); FLASH takes no mask,
     so it cannot express variable lengths and is not timed;
   * kv_cache_fp8_store: ``torch.compile`` of the reference;
3. extra calibration: the expert's autotuned configs (prefill, decode), a sweep of the decode
   split count, and an exhaustive check that the FP8 conversion of the Triton kernels equals
   PyTorch's bit for bit over every finite bf16 value at several scales.

It prints a table (task, workload, status, expert / straightforward / alternative ms,
expert/alt, achieved TFLOP/s or TB/s against the measured ceilings 790 TFLOP/s and 4.3 TB/s,
or the ratio to a 5 us launch floor for latency-class calls, and the bars) and writes
``gpu_tasks_attention.json`` (+ the log) to ``$OUT`` (or ``--out``).

Usage (repo root, one H200)::

    PYTHONPATH=src python devtools/gpu_tasks_attention.py [--tasks gqa_flash_prefill,...]
        [--workloads id,...] [--skip-eval] [--skip-alt] [--skip-extra] [--out DIR]

``--device cpu`` runs the same pipeline on the smoke workloads under the Triton interpreter
(a dry run of this script; the numbers mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

if ("--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1:][:1] == ["cpu"]) or not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # dry run: Triton's CPU interpreter (before triton is imported)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from d2kbench.harness import timing  # noqa: E402
from d2kbench.harness.env import fingerprint  # noqa: E402
from d2kbench.harness.evaluate import Options, evaluate  # noqa: E402
from d2kbench.tasks import load_task  # noqa: E402
from d2kbench.tasks.formula import evaluate_formula  # noqa: E402
from d2kbench.tasks.loader import import_file  # noqa: E402

TASKS = ("gqa_flash_prefill", "paged_decode_gqa", "kv_cache_fp8_store")
PEAK_TFLOPS = 790.0     # measured bf16 dense ceiling of our H200 (DESIGN.md section 4)
PEAK_TBPS = 4.3         # measured HBM copy ceiling
LAUNCH_FLOOR_MS = 0.005  # latency class: ~5 us per call
BARS = {"tc_frac": 0.50, "bw_frac": 0.70, "latency_x": 3.0}
LOG = None


def log(*a) -> None:
    msg = " ".join(str(x) for x in a)
    print(msg, flush=True)
    if LOG is not None:
        LOG.write(msg + "\n")
        LOG.flush()


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e)[:400]}"


# ---------------------------------------------------------------------------------------------
# Timers (the harness's own methodology)
# ---------------------------------------------------------------------------------------------
class Timer:
    def __init__(self, device: str):
        self.device = device
        self.flush_buf = None
        if device == "cuda":
            l2 = torch.cuda.get_device_properties(0).L2_cache_size
            self.flush_buf = torch.empty(max(2 * l2, 128 << 20), dtype=torch.uint8, device="cuda")

    def __call__(self, fn, mode: str) -> float:
        """Mean ms per call of ``fn()`` in ``mode`` (events with L2 flush, or graph replay)."""
        call = lambda i: fn()  # noqa: E731
        if self.device == "cpu":
            return timing.time_cpu(call, 1, samples=1).mean_ms
        if mode == "graph":
            return timing.time_graph(call, 1).mean_ms
        return timing.time_events(call, 1, flush=self.flush_buf.zero_).mean_ms


# ---------------------------------------------------------------------------------------------
# Harness evaluations
# ---------------------------------------------------------------------------------------------
def run_evaluations(task, workloads, device: str) -> dict:
    """{solution: {workload: record}} through evaluate() with the reference as baseline."""
    out = {}
    for sol in ("expert", "straightforward"):
        t0 = time.time()
        note = ""
        try:
            ev = evaluate(task, sol, workloads, device=device, baseline="reference", options=Options(),
                          progress=lambda m, s=sol: log(f"    [{task.id}/{s}] {m}"))
        except Exception as e:  # noqa: BLE001 - e.g. an integrity probe that cannot handle a dtype
            note = f"evaluate with default options raised {_err(e)}; retried with sensitivity=False"
            log("   ", note)
            ev = evaluate(task, sol, workloads, device=device, baseline="reference",
                          options=Options(sensitivity=False),
                          progress=lambda m, s=sol: log(f"    [{task.id}/{s}] {m}"))
        recs = {}
        scores = {s.workload: s for s in ev.scores}
        for r in ev.candidate.results:
            base = ev.baseline.result(r.workload) if ev.baseline else None
            worst = r.worst_check()
            recs[r.workload] = {
                "status": r.status.value, "cause": r.cause,
                "violations": [v.model_dump() for v in r.violations],
                "ms": r.timing.mean_ms if r.timing else None,
                "median_ms": r.timing.median_ms if r.timing else None,
                "ci95_ms": [r.timing.ci95_low_ms, r.timing.ci95_high_ms] if r.timing else None,
                "reference_ms": base.timing.mean_ms if base and base.timing else None,
                "reference_status": base.status.value if base else None,
                "speedup_vs_reference": scores[r.workload].speedup if r.workload in scores else None,
                "worst_check": (f"{worst.name} {worst.error:.3e}/{worst.threshold:.1e}" if worst else ""),
                "checks": [c.model_dump() for c in r.checks if c.call == 0],
            }
        out[sol] = {"workloads": recs, "geomean_speedup": ev.geomean_speedup, "wall_s": time.time() - t0,
                    "note": note, "env": ev.env}
        log(f"  {task.id}/{sol}: geomean speedup vs reference {ev.geomean_speedup} ({time.time() - t0:.0f}s)")
        for w, rec in recs.items():
            log(f"    {w:34s} {rec['status']:20s} {rec['ms']} ms  {rec['worst_check']}  {rec['cause'][:160]}")
    return out


# ---------------------------------------------------------------------------------------------
# Alternatives and in-process expert timings
# ---------------------------------------------------------------------------------------------
def _sdpa_backends():
    from torch.nn.attention import SDPBackend
    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def alt_prefill(task, wl, device, timer) -> dict:
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    ref = task.reference_module()
    expert = import_file(task.root / "solutions" / "expert.py", "gpu_attn_prefill_expert")
    inp = ref.make_inputs(wl.values(), 0, device)
    q, k, v, scale = inp["q"], inp["k"], inp["v"], inp["scale"]
    res = {}
    o_exp, _ = expert.run(q, k, v, scale)
    res["expert_inproc_ms"] = timer(lambda: expert.run(q, k, v, scale), "events")
    cfg = getattr(expert._attn_fwd_kernel, "best_config", None)
    res["expert_config"] = str(cfg) if cfg is not None else None
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)   # [B, H, S, D] views
    for name in ("flash", "cudnn"):
        backend = _sdpa_backends()[name]
        try:
            with sdpa_kernel([backend]):
                fn = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale, enable_gqa=True)  # noqa: E731
                o = fn()
                res[f"sdpa_{name}_ms"] = timer(fn, "events")
            res[f"sdpa_{name}_vs_expert_rel"] = _rel(o.transpose(1, 2), o_exp)
        except Exception as e:  # noqa: BLE001
            # GQA not supported by this backend: expand K/V outside the timed region
            try:
                G = q.shape[2] // k.shape[2]
                ke, ve = kt.repeat_interleave(G, 1), vt.repeat_interleave(G, 1)
                with sdpa_kernel([backend]):
                    fn = lambda: F.scaled_dot_product_attention(qt, ke, ve, is_causal=True, scale=scale)  # noqa: E731
                    o = fn()
                    res[f"sdpa_{name}_ms"] = timer(fn, "events")
                res[f"sdpa_{name}_vs_expert_rel"] = _rel(o.transpose(1, 2), o_exp)
                res[f"sdpa_{name}_note"] = f"enable_gqa failed ({_err(e)}); K/V expanded to Hq heads outside the timing"
            except Exception as e2:  # noqa: BLE001
                res[f"sdpa_{name}_error"] = _err(e2)
    best = [res[f"sdpa_{n}_ms"] for n in ("flash", "cudnn") if f"sdpa_{n}_ms" in res]
    res["alt_name"] = "sdpa_flash" if "sdpa_flash_ms" in res else ("sdpa_cudnn" if best else None)
    res["alt_ms"] = res.get("sdpa_flash_ms", best[0] if best else None)
    return res


def alt_decode(task, wl, device, timer, sweep: bool) -> dict:
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    ref = task.reference_module()
    expert = import_file(task.root / "solutions" / "expert.py", "gpu_attn_decode_expert")
    inp = ref.make_inputs(wl.values(), 0, device)
    args = [inp[a.name] for a in task.spec.args]
    q, kc, vc, bt, sl, scale = args
    B, Hq, D = q.shape
    NB, BS, Hkv, _ = kc.shape
    res = {}
    o_exp = expert.run(*args)
    res["expert_inproc_ms"] = timer(lambda: expert.run(*args), "graph")
    cfg = getattr(expert._paged_decode_kernel, "best_config", None)
    res["expert_config"] = str(cfg) if cfg is not None else None
    sms = torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else 4
    res["planned_splits"] = expert.plan_splits(B * Hkv, bt.shape[1] * BS, sms)
    if sweep:
        res["split_sweep_ms"] = {}
        for s in sorted({1, 2, 4, 8, 16, 32, res["planned_splits"]}):
            if s > max(1, bt.shape[1] * BS // 64):
                continue
            try:
                res["split_sweep_ms"][s] = timer(lambda s=s: expert.run_with_splits(*args, s), "graph")
            except Exception as e:  # noqa: BLE001
                res["split_sweep_ms"][s] = _err(e)
        log(f"      split sweep (ms): {res['split_sweep_ms']}  planned {res['planned_splits']}")
    # dense gather (the step a user of SDPA needs) -- NaN slots zeroed, padding masked
    L = bt.shape[1] * BS
    t = torch.arange(L, device=q.device)

    def gather():
        pages = bt[:, t // BS].long()
        slots = (t % BS)[None, :].expand_as(pages)
        ok = t[None, :] < sl[:, None]
        k = torch.where(ok[:, :, None, None], kc[pages, slots], 0).transpose(1, 2)   # [B, Hkv, L, D]
        v = torch.where(ok[:, :, None, None], vc[pages, slots], 0).transpose(1, 2)
        return k, v, ok[:, None, None, :]                                           # mask [B, 1, 1, L]

    k_d, v_d, mask = gather()
    q4 = q[:, :, None, :]                                                            # [B, Hq, 1, D]
    G = Hq // Hkv
    for name in ("efficient", "cudnn"):
        backend = _sdpa_backends()[name]
        for gqa in (True, False):   # native GQA first; else K/V expanded to Hq heads (in the gather)
            kd, vd = (k_d, v_d) if gqa else (k_d.repeat_interleave(G, 1), v_d.repeat_interleave(G, 1))
            try:
                with sdpa_kernel([backend]):
                    pre = lambda: F.scaled_dot_product_attention(q4, kd, vd, attn_mask=mask, scale=scale, enable_gqa=gqa)  # noqa: E731
                    o = pre()
                    res[f"sdpa_{name}_pregathered_ms"] = timer(pre, "graph")

                    def full():
                        kk, vv, mm = gather()
                        if not gqa:
                            kk, vv = kk.repeat_interleave(G, 1), vv.repeat_interleave(G, 1)
                        return F.scaled_dot_product_attention(q4, kk, vv, attn_mask=mm, scale=scale, enable_gqa=gqa)
                    res[f"gather+sdpa_{name}_ms"] = timer(full, "graph")
                res[f"sdpa_{name}_vs_expert_rel"] = _rel(o[:, :, 0], o_exp)
                res.pop(f"sdpa_{name}_error", None)
                if not gqa:
                    res[f"sdpa_{name}_note"] = "enable_gqa failed: K/V expanded to Hq heads (pregathered: outside the timing)"
                break
            except Exception as e:  # noqa: BLE001
                res[f"sdpa_{name}_error"] = _err(e)
            finally:
                del kd, vd
    res["sdpa_flash_note"] = "FLASH takes no attn_mask: variable lengths cannot be expressed on a padded dense cache"
    cands = [(f"sdpa_{n}_pregathered", res[f"sdpa_{n}_pregathered_ms"]) for n in ("efficient", "cudnn")
             if f"sdpa_{n}_pregathered_ms" in res]
    if cands:
        res["alt_name"], res["alt_ms"] = min(cands, key=lambda c: c[1])
    else:
        res["alt_name"], res["alt_ms"] = None, None
    del k_d, v_d
    return res


def alt_store(task, wl, device, timer) -> dict:
    ref = task.reference_module()
    expert = import_file(task.root / "solutions" / "expert.py", "gpu_attn_store_expert")
    inp = ref.make_inputs(wl.values(), 0, device)
    names = [a.name for a in task.spec.args]
    args = [inp[n] for n in names]
    res = {}
    res["expert_inproc_ms"] = timer(lambda: expert.run(*args), "graph")
    try:
        compiled = torch.compile(ref.run, dynamic=False)
        a1 = [x.clone() if isinstance(x, torch.Tensor) else x for x in args]
        a2 = [x.clone() if isinstance(x, torch.Tensor) else x for x in args]
        compiled(*a1)
        ref.run(*a2)
        same = all(torch.equal(a1[i].view(torch.uint8), a2[i].view(torch.uint8)) for i in (2, 3))
        res["torch_compile_bit_exact"] = bool(same)
        res["torch_compile_ms"] = timer(lambda: compiled(*args), "graph")
        res["alt_name"], res["alt_ms"] = "torch_compile(reference)", res["torch_compile_ms"]
    except Exception as e:  # noqa: BLE001
        res["torch_compile_error"] = _err(e)
        res["alt_name"], res["alt_ms"] = None, None
    return res


def fp8_exhaustive(task, device) -> dict:
    """Every finite bf16 value through expert and straightforward at several scales vs reference."""
    ref = task.reference_module()
    sols = {n: import_file(task.root / "solutions" / f"{n}.py", f"gpu_attn_fp8_{n}") for n in ("expert", "straightforward")}
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    vals = bits[torch.isfinite(bits.float())]
    D = 128
    T = vals.numel() // D
    key = vals[: T * D].reshape(T, 1, D).to(device)
    BS = 16
    NB = (T + BS - 1) // BS
    out = {}
    for s in (1.0, 0.37, 0.0123, 3.0, 1 / 448, 1e-3, 250.0):
        scale = torch.tensor([s], dtype=torch.float32, device=device)
        slots = torch.arange(T, dtype=torch.int64, device=device)
        base = torch.zeros(NB, BS, 1, D, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
        want = [key, key, base.clone(), base.clone(), slots, scale, scale]
        ref.run(*want)
        for n, m in sols.items():
            got = [key, key, base.clone(), base.clone(), slots, scale, scale]
            m.run(*got)
            diff = int((got[2].view(torch.uint8) != want[2].view(torch.uint8)).sum())
            out[f"{n}@{s:g}"] = diff
    log(f"  fp8 exhaustive (differing bytes over {T * D} bf16 values): {out}")
    return out


# ---------------------------------------------------------------------------------------------
# Table
# ---------------------------------------------------------------------------------------------
def achieved(task, wl, ms: float | None) -> dict:
    """Achieved rate on the floor work model, the binding resource and the bar."""
    if not ms:
        return {}
    c = task.spec.sol.counts(task.spec.sol.floor)
    flops = evaluate_formula(c.tc_flops, wl.axes)
    nbytes = evaluate_formula(c.bytes, wl.axes)
    t_tc = flops / (PEAK_TFLOPS * 1e12)
    t_bw = nbytes / (PEAK_TBPS * 1e12)
    sol_ms = max(t_tc, t_bw) * 1e3
    if sol_ms < LAUNCH_FLOOR_MS:
        x = ms / LAUNCH_FLOOR_MS
        return {"class": "latency", "x_launch_floor": x, "text": f"{x:.2f}x of 5us floor", "bar": x <= BARS["latency_x"]}
    if t_tc >= t_bw:
        rate = flops / (ms * 1e-3) / 1e12
        return {"class": "tensor_core", "tflops": rate, "frac": rate / PEAK_TFLOPS,
                "text": f"{rate:.0f} TFLOP/s ({100 * rate / PEAK_TFLOPS:.0f}%)", "bar": rate / PEAK_TFLOPS >= BARS["tc_frac"]}
    rate = nbytes / (ms * 1e-3) / 1e12
    return {"class": "memory", "tbps": rate, "frac": rate / PEAK_TBPS,
            "text": f"{rate:.2f} TB/s ({100 * rate / PEAK_TBPS:.0f}%)", "bar": rate / PEAK_TBPS >= BARS["bw_frac"]}


def table(rows: list[dict]) -> str:
    cols = ["task", "workload", "status", "expert ms", "straightfwd ms", "alt", "alt ms", "exp/alt",
            "exp/straight", "expert achieved", "bars"]
    lines = [" | ".join(cols), " | ".join("---" for _ in cols)]
    f = lambda x, p=4: "-" if x is None else (f"{x:.{p}f}" if isinstance(x, float) else str(x))  # noqa: E731
    for r in rows:
        lines.append(" | ".join([
            r["task"], r["workload"], r["status"], f(r.get("expert_ms")), f(r.get("straightforward_ms")),
            str(r.get("alt_name") or "-"), f(r.get("alt_ms")), f(r.get("expert_over_alt"), 3),
            f(r.get("expert_over_straightforward"), 3), r.get("achieved", {}).get("text", "-"), r.get("bars", "-"),
        ]))
    return "\n".join(lines)


def main() -> int:
    global LOG
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--workloads", default="", help="comma-separated workload ids (default: all registered)")
    ap.add_argument("--skip-eval", action="store_true")
    ap.add_argument("--skip-alt", action="store_true")
    ap.add_argument("--skip-extra", action="store_true", help="no split sweep, no fp8 exhaustive check")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu_tasks_attention_out"))
    a = ap.parse_args()
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    LOG = open(out_dir / "gpu_tasks_attention.log", "a")
    device = a.device
    env = fingerprint(device)
    log(f"== gpu_tasks_attention on {env.get('gpu', device)} torch {env['torch']} triton {env['triton']}")
    timer = Timer(device)
    wanted = {w for w in a.workloads.split(",") if w}
    report = {"env": env, "tasks": {}, "rows": [], "bars": BARS,
              "ceilings": {"bf16_tflops": PEAK_TFLOPS, "hbm_tbps": PEAK_TBPS, "launch_floor_ms": LAUNCH_FLOOR_MS}}
    t_start = time.time()
    for tid in [t for t in a.tasks.split(",") if t]:
        task = load_task(tid)
        pool = task.spec.workloads if device == "cuda" else task.spec.smoke_workloads
        wls = [w for w in pool if not wanted or w.id in wanted]
        log(f"\n== {tid}: {len(wls)} workloads ({', '.join(w.id for w in wls)})")
        rec = {"eval": {}, "alt": {}, "extra": {}}
        if not a.skip_eval:
            try:
                rec["eval"] = run_evaluations(task, wls, device)
            except Exception as e:  # noqa: BLE001
                rec["eval_error"] = traceback.format_exc()
                log("  evaluation failed:", _err(e))
        if tid == "kv_cache_fp8_store" and not a.skip_extra:
            try:
                rec["extra"]["fp8_exhaustive"] = fp8_exhaustive(task, device)
            except Exception as e:  # noqa: BLE001
                rec["extra"]["fp8_exhaustive_error"] = _err(e)
                log("  fp8 exhaustive check failed:", _err(e))
        for wl in wls:
            if wl.correctness_only or a.skip_alt:
                continue
            log(f"  alt {wl.id}")
            try:
                if tid == "gqa_flash_prefill":
                    rec["alt"][wl.id] = alt_prefill(task, wl, device, timer)
                elif tid == "paged_decode_gqa":
                    rec["alt"][wl.id] = alt_decode(task, wl, device, timer, sweep=not a.skip_extra)
                else:
                    rec["alt"][wl.id] = alt_store(task, wl, device, timer)
                log("    " + json.dumps({k: v for k, v in rec["alt"][wl.id].items() if k != "split_sweep_ms"}, default=str))
            except Exception as e:  # noqa: BLE001
                rec["alt"][wl.id] = {"error": traceback.format_exc()}
                log("    alternative failed:", _err(e))
            if device == "cuda":
                torch.cuda.empty_cache()
        report["tasks"][tid] = rec
        for wl in wls:
            ex = rec["eval"].get("expert", {}).get("workloads", {}).get(wl.id, {})
            sf = rec["eval"].get("straightforward", {}).get("workloads", {}).get(wl.id, {})
            alt = rec["alt"].get(wl.id, {})
            e_ms = ex.get("ms") or alt.get("expert_inproc_ms")
            row = {"task": tid, "workload": wl.id, "correctness_only": wl.correctness_only,
                   "status": f"{ex.get('status', '-')}/{sf.get('status', '-')}",
                   "expert_ms": ex.get("ms"), "expert_inproc_ms": alt.get("expert_inproc_ms"),
                   "straightforward_ms": sf.get("ms"), "reference_ms": ex.get("reference_ms"),
                   "alt_name": alt.get("alt_name"), "alt_ms": alt.get("alt_ms")}
            if e_ms and row["alt_ms"]:
                row["expert_over_alt"] = e_ms / row["alt_ms"]
            if ex.get("ms") and sf.get("ms"):
                row["expert_over_straightforward"] = ex["ms"] / sf["ms"]
            if not wl.correctness_only:
                row["achieved"] = achieved(task, wl, e_ms)
                bars = []
                if "bar" in row["achieved"]:
                    bars.append("rate " + ("ok" if row["achieved"]["bar"] else "MISS"))
                if "expert_over_straightforward" in row:
                    bars.append("vs straight " + ("ok" if row["expert_over_straightforward"] < 1 else "MISS"))
                if tid == "gqa_flash_prefill" and alt.get("sdpa_flash_ms") and e_ms:
                    bars.append("vs flash " + ("ok" if e_ms <= alt["sdpa_flash_ms"] else "MISS"))
                row["bars"] = ", ".join(bars)
            report["rows"].append(row)
        (out_dir / "gpu_tasks_attention.json").write_text(json.dumps(report, indent=1, default=str))
    log("\n" + table(report["rows"]))
    log(f"\ntotal {time.time() - t_start:.0f}s; JSON: {out_dir / 'gpu_tasks_attention.json'}")
    (out_dir / "gpu_tasks_attention.json").write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
