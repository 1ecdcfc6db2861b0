"""H200 check of the expert Muon / Polar Express Triton solution (self-contained script).

For each workload: correctness against the FP64 oracle on 2 matrices of the batch, then
INTERLEAVED timing of the PyTorch reference, the expert (default config and variants) and a
step-wise Triton baseline (the standard recurrence run with the expert's own kernels), with
CUDA events, an L2 flush before every call and warm-up calls excluded.  Optionally
(``--micro``) a per-kernel sweep of tile configs against cuBLAS for the same products.

Usage (repo root)::

    PYTHONPATH=src python3 devtools/muon_expert_gpu.py [--iters 10] [--micro] [--out DIR]
        [--variants default,sym,full,pad8,...] [--workloads 0,1,2] [--step]

Baselines in the interleaved timing: ``ref`` (reference.run, cuBLAS FP16) and ``straightfwd``
(solutions/straightforward.py, the step-wise Triton GEMM port); ``--step`` adds the step-wise
recurrence run with the expert's own (symmetric) kernels.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from d2kbench.suite.muon_newton_schulz import reference  # noqa: E402
from d2kbench.suite.muon_newton_schulz.solutions import (
    expert,  # noqa: E402
    straightforward,  # noqa: E402
)

WORKLOADS = [(32, 2048, 5464), (32, 4096, 11008), (8, 7168, 18432)]
T0 = time.time()
DEVICE = "cuda"
LOG = None


def log(*a):
    msg = " ".join(str(x) for x in a)
    print(msg, flush=True)
    if LOG is not None:
        LOG.write(msg + "\n")
        LOG.flush()


# ---------------------------------------------------------------------------------------------
def variant_configs(base: expert.MuonConfig) -> dict[str, expert.MuonConfig]:
    r = dataclasses.replace
    return {
        "default": base,
        "sym": r(base, state_mode="sym"),
        "full": r(base, state_mode="full"),
        "ptr": r(base, use_tma=False),
        "w8": r(base, sym_warps=8, syrk_warps=8),
        "w4": r(base, sym_warps=4, syrk_warps=4),
        "s5": r(base, sym_stages=5, syrk_stages=5),
        "s3": r(base, sym_stages=3, gemm_stages=3),
        "g128": r(base, gemm_bn=128, gemm_stages=4),
        "grp4": r(base, sym_group=4, gemm_group=4),
        "grp16": r(base, sym_group=16, gemm_group=16),
        "pad8": r(base, row_pad=8),
        "syrk_s4": r(base, syrk_stages=4),
        "syrk_w4": r(base, syrk_warps=4),
        "syrk_w8s5": r(base, syrk_warps=8, syrk_stages=5),
    }


def stepwise(G: torch.Tensor, cfg: expert.MuonConfig) -> torch.Tensor:
    """Standard recurrence with the expert's kernels: per step X X^T (symmetric), B = bA + cA^2
    (symmetric), X = a X + B X (rectangular).  Wide inputs only."""
    B, M, N = G.shape
    assert M <= N
    X = expert._normalize(G, False)
    out = torch.empty((B, M, N), device=G.device, dtype=torch.bfloat16)
    for k, (a, b, c) in enumerate(expert.POLAR_EXPRESS_COEFFS):
        A = expert._sym_product(X, None, cfg)
        Bk = expert._sym_product(A, A, cfg, alpha=c, C=A, beta=b)
        dst = out if k == expert.NUM_STEPS - 1 else torch.empty_like(X)
        X = expert._gemm(Bk, X, dst, cfg, C=X, beta=a)
    return out


def rel_err(out: torch.Tensor, o64: torch.Tensor) -> list[float]:
    d = (out.double() - o64).flatten(1).norm(dim=1) / o64.flatten(1).norm(dim=1)
    return [float(x) for x in d]


class Flusher:
    def __init__(self):
        self.buf = torch.empty(512 * 1024 * 1024, dtype=torch.int8, device="cuda")

    def __call__(self):
        self.buf.zero_()


def interleaved(fns: dict, iters: int, warmup: int = 1) -> dict[str, list[float]]:
    flush = Flusher()
    for _ in range(warmup):
        for f in fns.values():
            f()
    torch.cuda.synchronize()
    names = list(fns)
    times = {n: [] for n in names}
    for i in range(iters):
        order = names[i % len(names):] + names[: i % len(names)]
        for n in order:
            flush()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fns[n]()
            e.record()
            e.synchronize()
            times[n].append(s.elapsed_time(e))
    return times


# ---------------------------------------------------------------------------------------------
def check_and_time(wi: int, variants: list[str], iters: int, rows: list, do_step: bool):
    Bn, M, N = WORKLOADS[wi]
    G = reference.make_inputs({"B": Bn, "M": M, "N": N}, seed=0, device=DEVICE)["G"]
    base = expert.config_for(min(M, N), max(M, N))
    cfgs = variant_configs(base)
    # correctness on 2 matrices of the batch
    o64 = reference.oracle(G[:2])
    errs = {}
    errs["ref"] = rel_err(reference.run(G[:2]), o64)
    for v in list(variants):
        t = time.time()
        try:
            errs[v] = rel_err(expert.run_with_config(G, 5, cfgs[v])[:2], o64)
        except Exception as ex:  # noqa: BLE001
            log(f"  [{wi}] {v}: FAILED {type(ex).__name__}: {str(ex)[:300]}")
            variants = [x for x in variants if x != v]
            continue
        log(f"  [{wi}] {v}: first call (compile+run) {time.time() - t:.1f}s err {errs[v]}")
    if do_step:
        try:
            errs["stepwise"] = rel_err(stepwise(G[:2], base), o64)
        except Exception as ex:  # noqa: BLE001
            log(f"  [{wi}] stepwise: FAILED {type(ex).__name__}: {str(ex)[:300]}")
            do_step = False
    del o64
    log(f"W{wi} {WORKLOADS[wi]} errors: " + json.dumps({k: [f'{x:.2e}' for x in v] for k, v in errs.items()}))
    fns = {"ref": lambda: reference.run(G)}
    for v in variants:
        fns[v] = (lambda c: (lambda: expert.run_with_config(G, 5, c)))(cfgs[v])
    if do_step:
        fns["stepwise"] = lambda: stepwise(G, base)
    fns["straightfwd"] = lambda: straightforward.run(G)
    times = interleaved(fns, iters)
    ref_med = statistics.median(times["ref"])
    for n, ts in times.items():
        med, mean = statistics.median(ts), statistics.mean(ts)
        if n == "ref":
            fl = expert.standard_flops(Bn, M, N)
        elif n == "straightfwd":
            fl = expert.standard_flops(Bn, M, N)
        elif n == "stepwise":
            m, nn = min(M, N), max(M, N)  # X X^T symmetric (half), B = bA + cA^2 symmetric, B X full
            fl = Bn * 5 * (m * m * nn + m**3 + 2 * m * m * nn)
        else:
            fl = expert.expert_flops(Bn, M, N, state_mode=cfgs[n].state_mode)
        rows.append(dict(workload=str(WORKLOADS[wi]), impl=n, med_ms=med, mean_ms=mean, speedup=ref_med / med,
                         tflops=fl / med / 1e9, max_err=max(errs[n]) if n in errs else float("nan")))
        log(f"  {n:10s} med {med:8.2f} ms mean {mean:8.2f} ms speedup {ref_med / med:5.2f}x {fl / med / 1e9:6.0f} TFLOP/s")
    try:
        profile_kernels(G, cfgs["default"], wi)
    except Exception as ex:  # noqa: BLE001
        log(f"  profile FAILED {type(ex).__name__}: {str(ex)[:300]}")
    del G
    torch.cuda.empty_cache()


def profile_kernels(G, cfg, wi):
    """Per-kernel device time of one expert call (torch.profiler / CUPTI)."""
    from torch.profiler import ProfilerActivity, profile

    expert.run_with_config(G, 5, cfg)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        expert.run_with_config(G, 5, cfg)
        torch.cuda.synchronize()
    agg = {}
    for ev in prof.events():
        if ev.device_type.name == "CUDA":
            k = ev.name[:40]
            n, t = agg.get(k, (0, 0.0))
            agg[k] = (n + 1, t + ev.device_time_total / 1e3)
    tot = sum(t for _, t in agg.values())
    log(f"  W{wi} profile (default): total kernel time {tot:.2f} ms")
    for k, (n, t) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        log(f"    {k:40s} x{n:3d} {t:8.3f} ms")


def check_variants_inputs(wi: int, variants: list[str]):
    Bn, M, N = WORKLOADS[wi]
    cfgs = variant_configs(expert.config_for(min(M, N), max(M, N)))
    for var in ("low_rank_noise", "ill_conditioned"):
        G = reference.make_inputs({"B": 2, "M": M, "N": N, "variant": var}, seed=0, device=DEVICE)["G"]
        o64 = reference.oracle(G)
        e_ref = rel_err(reference.run(G), o64)
        msg = f"W{wi} {var}: ref err {[f'{x:.2e}' for x in e_ref]}"
        for v in variants:
            out = expert.run_with_config(G, 5, cfgs[v])
            e_exp = rel_err(out, o64)
            msg += f" | {v} {[f'{x:.2e}' for x in e_exp]} finite {bool(torch.isfinite(out.float()).all())}"
        log(msg)
    # tall input check (transposed iterate)
    G = reference.make_inputs({"B": 2, "M": N, "N": M}, seed=1, device=DEVICE)["G"]
    log(f"W{wi} tall {tuple(G.shape)}: expert err {[f'{x:.2e}' for x in rel_err(expert.run(G), reference.oracle(G))]}")


# ---------------------------------------------------------------------------------------------
def bench_op(fn, reps=5):
    fn()
    torch.cuda.synchronize()
    flush = Flusher()
    ts = []
    for _ in range(reps):
        flush()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts)


def micro(wi: int, rows: list, deadline: float):
    Bn, m, n = WORKLOADS[wi]
    r = dataclasses.replace
    base = expert.config_for(m, n)
    sym_cfgs = {
        "table": base,
        "w8s4": r(base, sym_warps=8, syrk_warps=8, sym_stages=4, syrk_stages=4),
        "w4s4": r(base, sym_warps=4, syrk_warps=4, sym_stages=4, syrk_stages=4),
        "w4s5": r(base, sym_warps=4, syrk_warps=4, sym_stages=5, syrk_stages=5),
        "w8s5": r(base, sym_warps=8, syrk_warps=8, sym_stages=5, syrk_stages=5),
        "w4s3bk128": r(base, sym_warps=4, syrk_warps=4, sym_stages=3, syrk_stages=3, sym_bk=128),
        "grp4": r(base, sym_group=4), "grp16": r(base, sym_group=16),
    }
    g = lambda bm, bn, w, st, grp: r(base, gemm_bm=bm, gemm_bn=bn, gemm_warps=w, gemm_stages=st, gemm_group=grp)  # noqa: E731
    gemm_cfgs = {
        "table": base,
        "128x256w8s3g8": g(128, 256, 8, 3, 8), "128x256w8s3g4": g(128, 256, 8, 3, 4),
        "128x256w8s4g8": g(128, 256, 8, 4, 8), "256x128w8s3g8": g(256, 128, 8, 3, 8),
        "256x128w8s3g4": g(256, 128, 8, 3, 4), "128x128w4s4g8": g(128, 128, 4, 4, 8),
    }
    X = expert._alloc_iterate(Bn, m, n, torch.device(DEVICE))
    X.copy_(torch.randn(Bn, m, n, device=DEVICE) / (m * n) ** 0.5)
    A = expert._sym_product(X, None, base)
    Q = torch.randn(Bn, m, m, device=DEVICE).half() / m**0.5
    outR = expert._alloc_iterate(Bn, m, n, torch.device(DEVICE))
    outS = torch.empty_like(Q)
    ops = [
        ("syrk", m * m * n * Bn, lambda c: expert._sym_product(X, None, c), lambda: torch.matmul(X, X.mT), sym_cfgs),
        ("sym_sq", m**3 * Bn, lambda c: expert._sym_product(A, A, c, alpha=0.5, C=A, beta=-2.0, diag=3.0),
         lambda: torch.matmul(A, A), sym_cfgs),
        ("gemm_sq", 2 * m**3 * Bn, lambda c: expert._gemm(A, Q, outS, c), lambda: torch.matmul(A, Q), gemm_cfgs),
        ("gemm_rect", 2 * m * m * n * Bn, lambda c: expert._gemm(Q, X, outR, c), lambda: torch.matmul(Q, X), gemm_cfgs),
    ]
    for name, fl, f, fref, cfgs in ops:
        t_ref = bench_op(fref)
        # cuBLAS does the full product: report its TFLOP/s on the full count, time ratio vs ours
        full = fl * (2 if name in ("syrk", "sym_sq") else 1)
        log(f"  M{wi} {name:9s} cublas      {t_ref:8.3f} ms {full / t_ref / 1e9:6.0f} TFLOP/s (full product)")
        rows.append(dict(workload=str(WORKLOADS[wi]), op=name, cfg="cublas", ms=t_ref, tflops=full / t_ref / 1e9))
        for cn, c in cfgs.items():
            if time.time() > deadline:
                log("  (deadline: skipping remaining micro configs)")
                return
            try:
                t = bench_op(lambda: f(c))
            except Exception as ex:  # noqa: BLE001
                log(f"  M{wi} {name:9s} {cn:11s} FAILED {type(ex).__name__}: {str(ex)[:200]}")
                continue
            log(f"  M{wi} {name:9s} {cn:11s} {t:8.3f} ms {fl / t / 1e9:6.0f} TFLOP/s (own FLOPs) vs cublas time x{t_ref / t:.2f}")
            rows.append(dict(workload=str(WORKLOADS[wi]), op=name, cfg=cn, ms=t, tflops=fl / t / 1e9))
    del X, A, Q, outR, outS
    torch.cuda.empty_cache()


def main():
    global LOG
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--micro", action="store_true")
    ap.add_argument("--no-e2e", action="store_true")
    ap.add_argument("--step", action="store_true", help="also time the symmetric step-wise variant")
    ap.add_argument("--variants", default="default,sym")
    ap.add_argument("--workloads", default="0,1,2")
    ap.add_argument("--micro-workloads", default="0,1,2")
    ap.add_argument("--budget", type=float, default=280.0, help="seconds; micro sweep stops after this")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    LOG = open(Path(args.out) / "muon_expert_gpu.log", "w")
    log(f"device {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    wls = [int(x) for x in args.workloads.split(",")]
    variants = args.variants.split(",")
    rows, mrows = [], []
    if not args.no_e2e:
        for wi in wls:
            check_and_time(wi, variants, args.iters, rows, args.step)
            log(f"  elapsed {time.time() - T0:.0f}s")
        try:
            for wi in sorted({wls[0], wls[-1]}):
                check_variants_inputs(wi, [v for v in variants if v in ("default", "sym", "full")])
        except Exception as ex:  # noqa: BLE001
            log(f"variant-input check FAILED {type(ex).__name__}: {str(ex)[:300]}")
    if args.micro:
        for wi in [int(x) for x in args.micro_workloads.split(",")]:
            micro(wi, mrows, T0 + args.budget)
            log(f"  elapsed {time.time() - T0:.0f}s")
    json.dump({"e2e": rows, "micro": mrows}, open(Path(args.out) / "muon_expert_gpu.json", "w"), indent=1)
    log("\n=== end-to-end (median of interleaved calls; TFLOP/s on each impl's own FLOPs) ===")
    log(f"{'workload':18s} {'impl':10s} {'med ms':>8s} {'mean ms':>8s} {'speedup':>8s} {'TFLOP/s':>8s} {'max err':>9s}")
    for r in rows:
        log(f"{r['workload']:18s} {r['impl']:10s} {r['med_ms']:8.2f} {r['mean_ms']:8.2f} {r['speedup']:7.2f}x "
            f"{r['tflops']:8.0f} {r['max_err']:9.2e}")
    log(f"total {time.time() - T0:.0f}s")


if __name__ == "__main__":
    main()
