"""fused_moe_fp8_block on the H200: where the expert's time goes, and whether its grouped FP8 GEMMs
reach a dense block-FP8 GEMM's efficiency (diagnostic evidence for the task's bars, not a benchmark).

Run from the repo root (PYTHONPATH holds src/):
    python3 devtools/fused_moe_fp8_breakdown.py OUTDIR [--budget S] [--dry-run]

1. per-kernel device times, as ``devtools/kernel_profile.py fused_moe_fp8_block:W1,W2,W3 -s expert
   -s straightforward`` measures them (its call splitting and markdown, one module instance per
   solution so that each autotunes once), and a split of each call into quant / align / GEMM1 /
   act / GEMM2 / combine by launch order and kernel name (straightforward launches one GEMM kernel
   twice: GEMM1 then GEMM2);
2. the dense analogue of each grouped GEMM: the same rows per expert (m = T k / active experts,
   rounded) against ALL experts' weights stacked into one dense [E N, K] matrix (a zero-copy view of
   w13 / w2 and their scales): the same FLOPs and the same weight bytes as the grouped GEMM, but one
   dense A operand (no gather, no per-expert segments, no padding rows). Timed with
   torch._scaled_mm blockwise (cuBLASLt) and, at prefill, the w8a8_block_fp8_matmul expert
   (Triton, TMA, 128x128 tiles), CUDA events after an L2 flush, median of N calls;
3. the autotuner's choice and per-config timings of the expert's GEMM kernels, and their registers
   and spills when Triton exposes them.

Writes OUTDIR/diag.json and OUTDIR/diag.md; prints the markdown.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import traceback
from pathlib import Path

REPO = Path.cwd()
sys.path.insert(0, str(REPO / "devtools"))
sys.path.insert(0, str(REPO / "src"))

TASK = "fused_moe_fp8_block"
WORKLOADS = ["qwen3_235b_t8192", "qwen3_235b_t64", "dsv3_tp8_t256"]   # the prefill first: the failing bar
SOLUTIONS = ["expert", "straightforward"]
T0 = time.time()


def left(budget: float) -> float:
    return budget - (time.time() - T0)


def classify(name: str) -> str:
    """The pipeline step of a kernel name (both solutions' kernels, torch fills)."""
    n = name.lower()
    for pat, step in (("gemm1", "gemm1"), ("gemm2", "gemm2"), ("block_fp8_gemm", "gemm"), ("quant", "quant"),
                      ("count|place|histogram|offsets|scatter|fill", "align"), ("silu", "act"),
                      ("combine|weighted_sum", "combine")):
        if re.search(pat, n):
            return step
    return "other"


def split_steps(calls: list[list[tuple[str, float]]]) -> dict:
    """Median-free summary: mean us per step over the calls; straightforward's two GEMM launches
    are GEMM1 (first) and GEMM2 (second)."""
    acc: dict[str, float] = {}
    for c in calls:
        seen_gemm = 0
        for st, en, name in c:
            us = en - st
            step = classify(name)
            if step == "gemm":
                seen_gemm += 1
                step = "gemm1" if seen_gemm == 1 else "gemm2"
            acc[step] = acc.get(step, 0.0) + us
    n = max(1, len(calls))
    return {k: v / n for k, v in acc.items()}


def tuned_info(mod) -> dict:
    """Autotuner choices, per-config timings (ms) and compiled registers/spills of a module's
    autotuned kernels (whatever this Triton version exposes)."""
    out: dict = {}
    for attr in dir(mod):
        obj = getattr(mod, attr)
        if type(obj).__name__ != "Autotuner":
            continue
        d: dict = {}
        try:
            d["best"] = str(obj.best_config)
        except Exception as e:  # noqa: BLE001
            d["best"] = f"? {e}"
        try:
            d["timings_ms"] = {str(c): [round(float(x), 4) for x in (t if isinstance(t, (list, tuple)) else [t])]
                               for c, t in (obj.configs_timings or {}).items()}
        except Exception as e:  # noqa: BLE001
            d["timings_ms"] = f"? {e}"
        try:
            regs = []
            fn = obj.fn
            for dev_cache in getattr(fn, "device_caches", {}).values():
                cache = dev_cache[0] if isinstance(dev_cache, tuple) else dev_cache
                for k in cache.values():
                    md = getattr(k, "metadata", None)
                    regs.append({"n_regs": getattr(k, "n_regs", None), "n_spills": getattr(k, "n_spills", None),
                                 "num_warps": getattr(md, "num_warps", None), "num_stages": getattr(md, "num_stages", None),
                                 "shared": getattr(md, "shared", None)})
            d["compiled"] = regs
        except Exception as e:  # noqa: BLE001
            d["compiled"] = f"? {e}"
        out[attr] = d
    return out


def event_time_ms(torch, fn, flush, n: int) -> float:
    """Median device time (ms) of ``fn()`` over n calls, each after an L2 flush (CUDA events;
    host wall time on the CPU smoke run)."""
    ts = []
    for _ in range(n):
        flush.zero_()
        if flush.device.type == "cpu":
            t = time.perf_counter()
            fn()
            ts.append(1e3 * (time.perf_counter() - t))
            continue
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def dense_analogues(torch, inputs: dict, w8a8, alt, flush, n_calls: int, with_w8a8_stream: bool = False) -> list[dict]:
    """Both GEMMs' dense analogues (see the module docstring), each timed with cuBLASLt and, at
    prefill (m > 64: its compute-bound tiles; decode too with ``with_w8a8_stream``, 16 more
    configs to compile), with the w8a8 expert; FLOPs, weight bytes and rates."""
    x, w13, s13, w2, s2, ids = (inputs[k] for k in ("x", "w13", "w13_scale", "w2", "w2_scale", "topk_ids"))
    T, H = x.shape
    E, I2, _ = w13.shape
    I = I2 // 2
    n = ids.numel()
    active = int((torch.bincount(ids.reshape(-1).long(), minlength=E) > 0).sum())
    m = max(1, round(n / active))
    dev = x.device
    g = torch.Generator(device=dev).manual_seed(7)
    rows = []
    for gemm, (w, s, K, N) in {"gemm1": (w13, s13, H, I2), "gemm2": (w2, s2, I, H)}.items():
        W = w[:active].reshape(active * N, K)                   # zero-copy: the first `active` experts
        Ws = s[:active].reshape(active * N // 128, K // 128)
        A = (torch.randn(m, K, device=dev, generator=g) * 0.5).to(torch.float8_e4m3fn)
        As = torch.rand(m, K // 128, device=dev, generator=g) * 1e-2 + 1e-3
        flops = 2.0 * m * active * N * K
        wbytes = active * N * K * (1 + 4 / 16384)
        for impl in (("w8a8_expert_triton", "scaled_mm_cublaslt") if m > 64 or with_w8a8_stream else ("scaled_mm_cublaslt",)):
            r = {"gemm": gemm, "impl": impl, "M": m, "N": active * N, "K": K, "active_experts": active,
                 "flops": flops, "weight_bytes": wbytes,
                 "note": ("cuBLASLt reads K padded to 512 (more weight bytes than counted)"
                          if impl != "w8a8_expert_triton" and K % 512 else "")}
            try:
                if impl == "w8a8_expert_triton":
                    fn = lambda A=A, As=As, W=W, Ws=Ws: w8a8.run(A, As, W, Ws)  # noqa: E731
                else:
                    ops = alt.blockwise_operands(A, As, W, Ws)
                    fn = lambda ops=ops: torch._scaled_mm(*ops, out_dtype=torch.bfloat16)  # noqa: E731
                for _ in range(3):
                    fn()
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                ms = event_time_ms(torch, fn, flush, n_calls)
                r.update(ms=ms, tflops=flops / ms / 1e9, weight_tbps=wbytes / ms / 1e9)
            except Exception as e:  # noqa: BLE001
                r["error"] = f"{type(e).__name__}: {e}"[:300]
            rows.append(r)
    return rows


def render(res: dict) -> str:
    """The markdown page of a result dict."""
    import kernel_profile as kp
    md = [kp.to_markdown(res["kernel_profile"]), "", "## Steps (us per call, ordered pass) and GEMM rates (useful FLOPs)", "",
          "| workload | solution | quant | align | gemm1 | act | gemm2 | combine | other | busy "
          "| gemm1 TFLOP/s (% FP8 ceil) | gemm2 TFLOP/s (% FP8 ceil) |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["steps"]:
        st = r["steps_us"]
        cells = [f"{st.get(k, 0):.1f}" for k in ("quant", "align", "gemm1", "act", "gemm2", "combine", "other")]
        rates = [f"{r.get(g + '_tflops', 0):.0f} ({r.get(g + '_pct_fp8_ceiling', 0):.1f}%)" for g in ("gemm1", "gemm2")]
        md.append(f"| {r['workload']} | {r['solution']} | " + " | ".join(cells) + f" | {r['busy_us']:.1f} | "
                  + " | ".join(rates) + " |")
    md += ["", "## Dense analogues (same rows per expert, all active experts' weights stacked: same FLOPs and weight bytes)", "",
           "| workload | gemm | impl | M x N x K | ms | TFLOP/s | weight TB/s |", "|---|---|---|---|---|---|---|"]
    for wl, rows in res["dense"].items():
        for r in rows:
            shape = f"{r['M']} x {r['N']} x {r['K']}"
            if "error" in r:
                md.append(f"| {wl} | {r['gemm']} | {r['impl']} | {shape} | error: {r['error'][:120].replace(chr(10), ' ')} | | |")
            else:
                md.append(f"| {wl} | {r['gemm']} | {r['impl']} | {shape} | {r['ms']:.4f} | {r['tflops']:.0f} | "
                          f"{r['weight_tbps']:.2f} {r.get('note', '')} |")
    md += ["", "## Expert autotuning (best config per kernel)", ""]
    for wl, info in res["tuning"].items():
        for kname, d in info.items():
            md.append(f"- {wl} `{kname}`: {d.get('best')}; compiled {str(d.get('compiled'))[:300]}")
    if "candidate_vs_expert_rel_fro" in res:
        md += ["", f"candidate vs expert output (prefill): rel_fro {res['candidate_vs_expert_rel_fro']:.3e}, "
                   f"max abs {res['candidate_vs_expert_max_abs']:.3e}"]
    if res["errors"]:
        md += ["", "## Errors", ""] + [f"- {e}" for e in res["errors"]]
    return "\n".join(md) + f"\n\nwall {res.get('wall_s', 0):.0f} s\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--budget", type=float, default=100.0, help="seconds; later sections are skipped past it")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--candidate", type=Path, default=None, help="a solution file profiled beside the expert")
    ap.add_argument("--dry-run", action="store_true", help="import and plan only (no GPU)")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="the dense-analogue code path on a CPU smoke workload (TRITON_INTERPRET=1; no rates)")
    a = ap.parse_args()
    a.outdir.mkdir(parents=True, exist_ok=True)

    import kernel_profile as kp
    import torch

    from d2kbench.checking.inputs import make_args
    from d2kbench.scoring.sol import MEASURED, gpu_key, sol_ms
    from d2kbench.tasks.loader import import_file, load_task

    task = load_task(TASK)
    ref = task.reference_module()
    alt_path = task.root / "alternatives" / "scaled_mm_per_expert.py"   # its blockwise_operands layout
    plan = {"workloads": WORKLOADS, "solutions": SOLUTIONS, "alt_helper": str(alt_path),
            "w8a8_expert": str(load_task("w8a8_block_fp8_matmul").resolve_solution("expert"))}
    if a.dry_run:
        print(json.dumps(plan, indent=1))
        return
    alt = import_file(alt_path, "smm_alt_scaled_mm")
    w8a8 = import_file(load_task("w8a8_block_fp8_matmul").resolve_solution("expert", "cuda"), "smm_w8a8_expert")
    if a.cpu_smoke:
        w = task.spec.smoke_workloads[4]
        inputs = ref.make_inputs({**w.axes, **(w.params or {})}, 0, "cpu")
        rows = dense_analogues(torch, inputs, w8a8, alt, torch.empty(16, dtype=torch.uint8), 1, with_w8a8_stream=True)
        names = [["_quant_x_kernel", "_count_kernel", "_gemm1_act_quant_kernel", "_gemm2_weighted_kernel", "_combine_kernel"],
                 ["_group_quant_kernel", "_block_fp8_gemm_kernel", "_silu_mul_kernel", "_group_quant_kernel",
                  "_block_fp8_gemm_kernel", "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>>"]]
        calls = [[(10.0 * i, 10.0 * i + 1 + i, nm) for i, nm in enumerate(c)] for c in names]
        torch.cuda.get_device_name = lambda *_: "cpu smoke"  # kernel_profile's page header
        print(kp.to_markdown([kp.summary_row(TASK, "smoke", s, [c], 1.0) for s, c in zip(SOLUTIONS, calls)]))
        fake = {"kernel_profile": [kp.summary_row(TASK, "smoke", s, [c], 1.0) for s, c in zip(SOLUTIONS, calls)],
                "steps": [{"workload": "smoke", "solution": s, "steps_us": split_steps([c]), "busy_us": 1.0,
                           "gemm1_tflops": 1.0, "gemm1_pct_fp8_ceiling": 0.1} for s, c in zip(SOLUTIONS, calls)],
                "dense": {"smoke": rows}, "tuning": {"smoke": {"_gemm1_tuned": {"best": "x", "compiled": []}}},
                "errors": ["an error"], "wall_s": 1.0}
        print(render(fake))
        print(json.dumps({"dense": rows, "steps": [split_steps([c]) for c in calls], "tuning": tuned_info(import_file(
            task.resolve_solution("expert", "cpu"), "smm_expert_cpu"))}, indent=1, default=str))
        return
    ceil = MEASURED.get(gpu_key(torch.cuda.get_device_name()) or "")
    res: dict = {"plan": plan, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "fp8_ceiling_tflops": getattr(ceil, "fp8_tflops", None), "hbm_ceiling_tbps": getattr(ceil, "hbm_tbps", None),
                 "kernel_profile": [], "steps": [], "tuning": {}, "dense": {}, "errors": []}
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    mods = {s: import_file(task.resolve_solution(s, "cuda"), f"smm_diag_{s}") for s in SOLUTIONS}
    if a.candidate is not None:               # a variant of the expert, profiled beside it
        mods["candidate"] = import_file(a.candidate, "smm_diag_candidate")
    for wl in WORKLOADS:
        if left(a.budget) < 12:
            res["errors"].append(f"{wl}: skipped (budget)")
            continue
        w = task.spec.workload(wl)
        try:
            args = make_args(ref, task.spec, w, 1234, "cuda")
        except Exception as e:  # noqa: BLE001
            res["errors"].append(f"{wl} inputs: {e}")
            continue
        inputs = dict(zip([x.name for x in task.spec.args], args))
        T, k = inputs["topk_ids"].shape
        H = inputs["x"].shape[1]
        I = inputs["w13"].shape[1] // 2
        useful = {"gemm1": 2.0 * T * k * H * 2 * I, "gemm2": 2.0 * T * k * I * H}
        sol_us = sol_ms(task.spec.sol.counts(task.spec.sol.floor), w.axes, ceil)[0] * 1e3 if ceil else None
        sols = SOLUTIONS + (["candidate"] if "candidate" in mods and wl == WORKLOADS[0] else [])
        for s in sols:
            try:
                for _ in range(3):                     # compile, autotune, warm
                    out = mods[s].run(*args)
                if s == "candidate":                   # same function as the expert: the outputs agree
                    ref_out = mods["expert"].run(*args).float()
                    res["candidate_vs_expert_rel_fro"] = float((out.float() - ref_out).norm() / ref_out.norm())
                    res["candidate_vs_expert_max_abs"] = float((out.float() - ref_out).abs().max())
                    del ref_out
                del out
                calls = kp.profiled_calls(mods[s].run, args, a.calls)
                res["kernel_profile"].append(kp.summary_row(TASK, wl, s, calls, sol_us))
                st = split_steps(calls)
                row = {"workload": wl, "solution": s, "steps_us": st, "busy_us": sum(st.values())}
                for gname, fl in useful.items():
                    if gname in st and st[gname] > 0:
                        row[f"{gname}_tflops"] = fl / (st[gname] * 1e-6) / 1e12
                        if ceil:
                            row[f"{gname}_pct_fp8_ceiling"] = 100 * row[f"{gname}_tflops"] / ceil.fp8_tflops
                res["steps"].append(row)
                if s in ("expert", "candidate"):
                    res["tuning"][f"{s}:{wl}"] = tuned_info(mods[s])
            except Exception as e:  # noqa: BLE001
                res["errors"].append(f"{wl} {s}: {type(e).__name__}: {e}"[:400])
                traceback.print_exc()
            print(f"[{time.time() - T0:.0f}s] profiled {wl} {s}", file=sys.stderr, flush=True)
            save(res, a.outdir)
        if left(a.budget) > 8:
            try:
                res["dense"][wl] = dense_analogues(torch, inputs, w8a8, alt, flush, a.calls)
                res["tuning"][f"w8a8:{wl}"] = tuned_info(w8a8)
            except Exception as e:  # noqa: BLE001
                res["errors"].append(f"{wl} dense: {type(e).__name__}: {e}"[:400])
            print(f"[{time.time() - T0:.0f}s] dense {wl}", file=sys.stderr, flush=True)
        del args, inputs
        torch.cuda.empty_cache()
        save(res, a.outdir)                   # after every workload: a timeout keeps what was measured
    print(save(res, a.outdir))


def save(res: dict, outdir: Path) -> str:
    """Write diag.json and diag.md; returns the page."""
    res["wall_s"] = time.time() - T0
    (outdir / "diag.json").write_text(json.dumps(res, indent=1, default=str))
    page = render(res)
    (outdir / "diag.md").write_text(page)
    return page


if __name__ == "__main__":
    main()
