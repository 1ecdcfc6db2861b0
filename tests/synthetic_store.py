"""A small synthetic results store with hand-computable scores, for report and score tests.

Evaluation rows go through the real ``Store.record``; runs, candidates, turns and verdicts are
inserted with plain SQL in the store's schema (the agent runner and the judge own those writers).

Baseline ``reference``; task speedups (geometric mean over workloads) by design:

=========  ==========  =========================  ===================  =======
model      guidance    muon_newton_schulz         toy_softmax          S_perf
=========  ==========  =========================  ===================  =======
model-a    none        2.0 (turn 9; first t5)     1.25 (t3)            sqrt(2.5)
model-a    L1          2.0 (t4)                   failed -> 0.5        1.0
model-a    L1+L2       2.5 (t3)                   2.0 (t6)             sqrt(5)
model-a    L1+L2+L3    4.0 (t2)                   4.0 (t4; t8 is 2.5)  4.0
model-b    none        failed -> 0.5              0.05 (t5)            sqrt(0.025)
model-b    L1+L2+L3    50**(1/3) (t7; SOL viol.)  2.0 (t3)             sqrt(2 * 50**(1/3))
model-c    none        1.0 (t10)                  1.0 (t1)             1.0
model-c    L1+L2+L3    2.0 (t6)                   2.0 (t2)             2.0
model-d    L1+L2+L3    2.0 (t4)                   no run -> 0.5        1.0
=========  ==========  =========================  ===================  =======

Declared tasks: campaign ``paper`` (plan recorded in the store) declares both tasks for models
a, b and c at all four guidance levels, so model-b at L1 and L1+L2 and model-c at L1+L2 have
no run (every task failed), and model-c at L1 has one running run (Muon) and no toy run.
Campaign ``extra`` declares model-d, paired: no unguided run at all (S_perf 0.5), and only a
guided Muon run, priced at no price (its cost is unknown). A reference evaluation of Muon that
was interrupted (absurd latencies) must be left out. Impl verdicts target the final
candidate's source hash; a second judge configuration (judge-y, prompt p2) judged one run.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from d2kbench.results import SolutionRun, Status, TimingStats, WorkloadResult
from d2kbench.store import Store

H200_ENV = {"gpu": "NVIDIA H200", "device": "cuda", "driver": "580.95", "cuda_runtime": "12.8", "torch": "2.13.0",
            "triton": "3.6.0", "time_utc": "2026-11-28T12:00:00+00:00"}
CPU_ENV = {"device": "cpu", "torch": "2.13.0", "triton": "3.6.0", "time_utc": "2026-11-28T12:00:00+00:00"}
CREATED = "2026-11-28T12:00:00Z"

MUON = ("paper_32x2048x5464", "paper_32x4096x11008", "paper_8x7168x18432")
MUON_ADV = "adv_low_rank_noise_4x2048x5464"
TOY = ("w1", "w2")
WORKLOADS = {"muon_newton_schulz": MUON, "toy_softmax": TOY}

#: Per task: solution -> latencies (ms) per workload, in WORKLOADS order.
SOLUTIONS = {
    "muon_newton_schulz": {"reference": (40.0, 320.0, 400.0), "straightforward": (32.0, 256.0, 320.0),
                           "expert": (16.0, 128.0, 160.0)},
    "toy_softmax": {"reference": (1.0, 4.0), "straightforward": (0.5, 2.0), "expert": (0.25, 1.0)},
}

FAIL = "incorrect"
#: (model, guidance) -> task -> [(turn, latencies or FAIL)]
RUNS = {
    ("model-a", "none"): {"muon_newton_schulz": [(2, FAIL), (5, (32.0, 256.0, 320.0)), (9, (20.0, 160.0, 200.0))],
                          "toy_softmax": [(3, (0.8, 3.2))]},
    ("model-a", "L1"): {"muon_newton_schulz": [(4, (20.0, 160.0, 200.0))], "toy_softmax": [(2, FAIL)]},
    ("model-a", "L1+L2"): {"muon_newton_schulz": [(3, (16.0, 128.0, 160.0))], "toy_softmax": [(6, (0.5, 2.0))]},
    ("model-a", "L1+L2+L3"): {"muon_newton_schulz": [(2, (10.0, 80.0, 100.0))],
                              "toy_softmax": [(4, (0.25, 1.0)), (8, (0.4, 1.6))]},
    ("model-b", "none"): {"muon_newton_schulz": [(3, FAIL), (6, FAIL)], "toy_softmax": [(5, (20.0, 80.0))]},
    ("model-b", "L1+L2+L3"): {"muon_newton_schulz": [(7, (5.0, 128.0, 160.0))], "toy_softmax": [(3, (0.5, 2.0))]},
    ("model-c", "none"): {"muon_newton_schulz": [(10, (40.0, 320.0, 400.0))], "toy_softmax": [(1, (1.0, 4.0))]},
    ("model-c", "L1+L2+L3"): {"muon_newton_schulz": [(6, (20.0, 160.0, 200.0))], "toy_softmax": [(2, (0.5, 2.0))]},
}
BUDGET = 12
#: Token usage per turn by guidance: (input, output, cache read, cache write 5m, cache write 1h, cost USD).
TOKENS = {"none": (1000, 200, 5000, 300, 100, 0.05), "L1": (1100, 210, 6000, 320, 100, 0.055),
          "L1+L2": (1150, 205, 7000, 340, 100, 0.06), "L1+L2+L3": (1200, 205, 8000, 360, 100, 0.065),
          "design": (900, 400, 2000, 200, 0, 0.03)}
TURNS_PER_RUN = 3


def run_id(model: str, guidance: str, task: str) -> str:
    return f"{model}.{guidance}.{task}"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def timing(ms: float) -> TimingStats:
    return TimingStats(mode="events", samples_ms=[ms] * 3, n=3, mean_ms=ms, median_ms=ms, std_ms=0.0, p10_ms=ms,
                       p90_ms=ms, min_ms=ms, max_ms=ms, ci95_low_ms=ms, ci95_high_ms=ms)


def add_evaluation(store: Store, eval_id: str, task: str, solution: str, digest: str, role: str,
                   latencies: tuple | str, env: dict = H200_ENV, status: str = "complete") -> None:
    """Record one solution on a task's workloads: ``latencies`` per timed workload, or FAIL
    (the first workload incorrect). Muon evaluations also carry a correctness-only workload."""
    run = SolutionRun(solution=solution, path=f"/synthetic/{solution}.py", sha256=digest, role=role)
    results = []
    for i, wl in enumerate(WORKLOADS[task]):
        if latencies == FAIL:
            results.append(WorkloadResult(workload=wl, status=Status.INCORRECT if i == 0 else Status.OK,
                                          cause="call 0: out:oracle:rel_fro error 3e-1 > 1.2e-2" if i == 0 else "",
                                          timing=None if i == 0 else timing(1.0)))
        else:
            results.append(WorkloadResult(workload=wl, status=Status.OK, timing=timing(latencies[i])))
    if task == "muon_newton_schulz":
        results.append(WorkloadResult(workload=MUON_ADV, status=Status.OK, correctness_only=True))
    if status == "interrupted":
        results = results[:1]  # killed after its first workload
    for r in results:
        store.record(eval_id, task, run, r, "cuda" if env.get("gpu") else "cpu", env, CREATED)
    store.finish_evaluation(eval_id, status)


def final_index(candidates: list) -> int | None:
    """Index of the final candidate by the selection rule: lowest geometric-mean latency among
    the eligible ones, the earlier turn on ties."""
    ok = [(math.prod(lat) ** (1 / len(lat)), turn, i) for i, (turn, lat) in enumerate(candidates) if lat != FAIL]
    return min(ok)[2] if ok else None


def final_sha(model: str, guidance: str, task: str) -> str:
    """Source hash of the final candidate of a run in RUNS."""
    rid = run_id(model, guidance, task)
    return sha(f"{rid}#{final_index(RUNS[(model, guidance)][task])}")


def add_run(store: Store, model: str, guidance: str, task: str, candidates: list, status: str = "finished",
            campaign: str = "paper", env: dict = H200_ENV, rid: str | None = None, run_key: str | None = None,
            attempt: int = 1, unpriced: bool = False) -> str:
    rid = rid or run_id(model, guidance, task)
    with store.conn:
        store.conn.execute(
            "INSERT INTO runs(run_id, campaign, task, model, backend, guidance, seed, budget_turns, status, started_at,"
            " finished_at, config_json, run_key, attempt) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (rid, campaign, task, model, "builtin", guidance, 0, BUDGET, status, CREATED, CREATED, "{}", run_key,
             attempt))
    ids = []
    for i, (turn, lat) in enumerate(candidates):
        digest = sha(f"{rid}#{i}")
        eval_id = f"{rid}#{i}"
        add_evaluation(store, eval_id, task, f"/runs/{rid}/cand{i}.py", digest, "candidate", lat, env)
        with store.conn:
            cur = store.conn.execute(
                "INSERT INTO candidates(run_id, turn, solution_sha256, path, eval_id, eligible, geomean_speedup,"
                " created_at) VALUES (?,?,?,?,?,?,?,?)",
                (rid, turn, digest, f"/runs/{rid}/cand{i}.py", eval_id, int(lat != FAIL), None, CREATED))
            ids.append(cur.lastrowid)
    final = final_index(candidates)
    if status not in ("running", "interrupted"):
        with store.conn:
            store.conn.execute("UPDATE runs SET final_candidate = ? WHERE run_id = ?",
                               (ids[final] if final is not None else None, rid))
    inp, out, cr, cw5, cw1, cost = TOKENS[guidance]
    with store.conn:
        for t in range(1, TURNS_PER_RUN + 1):
            store.conn.execute(
                "INSERT INTO turns(run_id, turn, input_tokens, output_tokens, cache_read, cache_write_5m,"
                " cache_write_1h, cost_usd, created_at, model, unpriced) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (rid, t, inp, out, cr, cw5, cw1, 0.0 if unpriced else cost, CREATED, model, int(unpriced)))
    return rid


def add_verdict(store: Store, kind: str, task: str, target: str, js: float, judge: str = "judge-x",
                prompt: str = "p1", subject_sha: str = "") -> None:
    verdict = {"js": js, **({"subject": {"sha256": subject_sha}} if subject_sha else {})}
    with store.conn:
        store.conn.execute(
            "INSERT INTO verdicts(kind, task, target, model, prompt_version, rubric_version, input_hash, l1, l2, l3,"
            " js, verdict_json, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (kind, task, target, judge, prompt, "r1", sha(f"{kind}{target}{js}{judge}"), js, js, js, js,
             json.dumps(verdict), CREATED))


PLANS = {
    "paper": {"name": "paper", "design": "custom", "guidance": ["none", "L1", "L1+L2", "L1+L2+L3"],
              "tasks": ["muon_newton_schulz", "toy_softmax"],
              "agents": [{"model": m, "backend": "openai", "options": {"api_key": "sk-secret-of-the-plan"}}
                         for m in ("model-a", "model-b", "model-c")]},
    "extra": {"name": "extra", "design": "paired", "tasks": ["muon_newton_schulz", "toy_softmax"],
              "agents": [{"model": "model-d", "backend": "openai"}]},
}


def build(path: Path, models: set[str] | None = None) -> Path:
    """Write the synthetic store of the module docstring to ``path``. ``models``: only the runs,
    verdicts and plans of these models (the task solutions' evaluations always; the verdict that
    matches nothing goes with model-a), as one machine of several would hold them."""
    mine = (lambda m: True) if models is None else (lambda m: m in models)
    store = Store(path)
    for name, plan in PLANS.items():
        if any(mine(a["model"]) for a in plan["agents"]):
            store.record_plan(name, plan)
    # an older expert version (another sha256, recorded first) that must be ignored: not the newest
    add_evaluation(store, "muon_newton_schulz.expert.old", "muon_newton_schulz", "expert", sha("old expert"),
                   "candidate", (100.0, 800.0, 1000.0))
    for task, sols in SOLUTIONS.items():
        for name, lat in sols.items():
            if task == "muon_newton_schulz" and name == "reference":
                # timed twice (the second time as an interleaved baseline): 41 and 39 ms pool to 40 ms
                add_evaluation(store, f"{task}.{name}.1", task, name, sha(f"{task}/{name}"), "candidate",
                               (lat[0] + 1.0, *lat[1:]))
                add_evaluation(store, f"{task}.{name}.2", task, name, sha(f"{task}/{name}"), "baseline",
                               (lat[0] - 1.0, *lat[1:]))
                # killed after its first workload: never used
                add_evaluation(store, f"{task}.{name}.3", task, name, sha(f"{task}/{name}"), "candidate",
                               (4000.0, 1.0, 1.0), status="interrupted")
            else:
                add_evaluation(store, f"{task}.{name}.1", task, name, sha(f"{task}/{name}"), "candidate", lat)
    for (model, guidance), tasks in RUNS.items():
        for task, cands in tasks.items():
            if mine(model):
                add_run(store, model, guidance, task, cands)
    if mine("model-c"):
        add_run(store, "model-c", "L1", "muon_newton_schulz", [(1, (40.0, 320.0, 400.0))], status="running")
    if mine("model-d"):
        add_run(store, "model-d", "L1+L2+L3", "muon_newton_schulz", [(4, (20.0, 160.0, 200.0))], campaign="extra",
                unpriced=True)
    for model in ("model-a", "model-b"):
        if mine(model):
            add_run(store, model, "design", "muon_newton_schulz", [])
            js = {"model-a": 70.0, "model-b": 60.0}[model]
            add_verdict(store, "design", "muon_newton_schulz", run_id(model, "design", "muon_newton_schulz"), js)
    impl = {("model-a", "none", "muon_newton_schulz"): [50.0], ("model-a", "L1+L2+L3", "muon_newton_schulz"): [80.0],
            ("model-a", "L1+L2+L3", "toy_softmax"): [70.0], ("model-b", "none", "toy_softmax"): [40.0],
            ("model-b", "L1+L2+L3", "muon_newton_schulz"): [75.0, 77.0],
            ("model-c", "none", "muon_newton_schulz"): [55.0], ("model-c", "none", "toy_softmax"): [65.0],
            ("model-c", "L1+L2+L3", "muon_newton_schulz"): [72.0], ("model-c", "L1+L2+L3", "toy_softmax"): [68.0]}
    for (model, guidance, task), scores in impl.items():
        for js in scores:
            if mine(model):
                add_verdict(store, "impl", task, final_sha(model, guidance, task), js)
    if mine("model-a"):
        # an older verdict that targets the run and records the final candidate's source: counted
        add_verdict(store, "impl", "toy_softmax", run_id("model-a", "none", "toy_softmax"), 60.0,
                    subject_sha=final_sha("model-a", "none", "toy_softmax"))
        # a verdict of model-a's unguided Muon run that judged its turn-5 candidate, not the final one
        add_verdict(store, "impl", "muon_newton_schulz", run_id("model-a", "none", "muon_newton_schulz"), 10.0,
                    subject_sha=sha(f"{run_id('model-a', 'none', 'muon_newton_schulz')}#1"))
        # a second judge configuration: never pooled with judge-x
        add_verdict(store, "impl", "muon_newton_schulz", final_sha("model-a", "L1+L2+L3", "muon_newton_schulz"),
                    90.0, judge="judge-y", prompt="p2")
        add_verdict(store, "impl", "toy_softmax", "no-such-target", 99.0)
    store.close()
    return path
