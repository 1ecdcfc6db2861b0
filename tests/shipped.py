"""One harness evaluation per shipped solution (reference, straightforward, expert) of every
task, shared by the tests that assert on it.

The Triton interpreter needs seconds per call on the CPU, and several test files assert on the
same solutions: ``test_integrity_fp.py`` and ``test_integrity_fp_expert.py`` (no integrity defence
flags a shipped solution: :func:`assert_not_flagged`) and the
task files (expert and straightforward pass every check on the smoke workloads that exercise
their code paths). Each (task, solution) is evaluated once per test session, on the union of the
smoke workloads those tests need, with every integrity defence on; every test then asserts on
that one real evaluation.

With ``pytest -n 2 --dist loadfile`` the test files run in different worker processes, so the
evaluations are kept as JSON files in a folder of the session shared by its workers (the parent
of the workers' base temp folders, as pytest-xdist documents it); a file lock per evaluation
makes a second worker wait for the first one's answer instead of evaluating again. Nothing is
reused across sessions: each session evaluates afresh.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

import pytest

from d2kbench.harness.evaluate import Options, evaluate
from d2kbench.integrity.parent import external_edit_only
from d2kbench.results import Evaluation, WorkloadResult
from d2kbench.tasks import list_tasks, load_task

#: Every (task, solution) the suite ships, in the registry's order.
SOLUTIONS = [(t, name) for t in list_tasks() for name in load_task(t).solutions()]
_KNOWN = set(SOLUTIONS)

#: The shared evaluations that cost the test run the most CPU time (each 40-120 s under the
#: interpreter on the 2-core CI machine: the token-loop straightforward ports of the two recurrent
#: tasks, their chunked experts, and the fused linear cross-entropy's forward-backward). The tests
#: that assert on them carry the ``slow`` marker (:func:`param`): CI runs them in its second step
#: (``-m slow``), the README's test command leaves them out. Their tasks' other tests (the
#: classic-bug mutants, the reference and tolerance probes) stay in the first step.
HEAVY = {(t, s) for t in ("fused_linear_cross_entropy", "gated_deltanet_chunk_prefill", "mamba2_ssd_chunk_scan")
         for s in ("expert", "straightforward")}

#: Every smoke workload per solution instead of the sample below (do that before a release).
ALL_SMOKE = os.environ.get("D2K_FP_ALL_SMOKE") == "1"

#: Smoke workloads the task test files assert on, beyond the first timed smoke workload that every
#: Triton solution runs (the expert's second code path, edge cases, correctness-only workloads).
#: A task file asking for a workload missing here fails and names this table.
ASSERTED: dict[tuple[str, str], list[str]] = {
    # tests/test_task_attention.py
    ("gqa_flash_prefill", "expert"): ["smoke_b1_s64_h3x1_d16", "smoke_peaky_b1_s40_h2x2_d64"],
    ("gqa_flash_prefill", "straightforward"): ["smoke_b1_s64_h3x1_d16"],
    ("paged_decode_gqa", "expert"): ["smoke_b6_h6x1_d16_bs24_edge", "smoke_b4_h4x2_d32_bs16"],
    ("paged_decode_gqa", "straightforward"): ["smoke_b6_h6x1_d16_bs24_edge"],
    ("kv_cache_fp8_store", "expert"): ["smoke_t5_h1x64_bs24_decode", "smoke_t8_all_padding"],
    ("kv_cache_fp8_store", "straightforward"): ["smoke_t5_h1x64_bs24_decode"],
    # tests/test_task_decode.py
    ("flash_decode_splitkv", "expert"): ["smoke_b2_h4x1_d16_l256", "smoke_b3_h8x2_d64_l32_onechunk"],
    ("flash_decode_splitkv", "straightforward"): ["smoke_b2_h4x1_d16_l256"],
    ("mla_decode_absorbed", "expert"): ["smoke_edge_b5_h16_p16", "smoke_b2_h80_two_blocks"],
    ("mla_decode_absorbed", "straightforward"): ["smoke_edge_b5_h16_p16"],
    ("cascade_prefix_decode", "expert"): ["smoke_edge_n8_h6x1_d16_p21", "smoke_short_prefix_n4_h4x1_d16_p5"],
    ("cascade_prefix_decode", "straightforward"): ["smoke_edge_n8_h6x1_d16_p21"],
    # tests/test_task_quant.py
    ("w8a8_block_fp8_matmul", "expert"): ["smoke_m37_n200_k384_spread", "smoke_m130_n320_k256"],
    ("w8a8_block_fp8_matmul", "straightforward"): ["smoke_m37_n200_k384_spread"],
    ("w4a16_gemm", "expert"): ["smoke_m5_n136_k256_extreme", "smoke_m130_n264_k384"],
    ("w4a16_gemm", "straightforward"): ["smoke_m5_n136_k256_extreme"],
    ("fused_add_rmsnorm_fp8_quant", "expert"): ["smoke_t7_h384_col", "smoke_t6_h512_magnitudes"],
    ("fused_add_rmsnorm_fp8_quant", "straightforward"): ["smoke_t7_h384_col"],
    # tests/test_task_moe.py (expert and straightforward on both)
    **{(t, s): w for t, w in {
        "moe_align_block_size": ["smoke_t5_k2_e4_b4", "smoke_t400_k3_e24_b8_skewed"],
        "per_token_group_quant_fp8": ["smoke_m37_k256_col", "smoke_m9_k1024_col_ue8m0_outliers"],
        "fused_moe_bf16": ["smoke_t1_h64_i48_e8_k4", "smoke_t80_h32_i48_e2_k1"],
        # tests/test_task_moe_routing_fp8.py
        "moe_grouped_topk": ["smoke_t33_e64_g8_k8_ties", "smoke_t5_e48_g1_k6"],
        "fused_moe_fp8_block": ["smoke_t3_h128_i128_e2_k2", "smoke_t50_h128_i128_e2_k1"],
    }.items() for s in ("expert", "straightforward")},
    # tests/test_task_fused_linear_cross_entropy.py: the correctness-only workload (two chunks)
    ("fused_linear_cross_entropy", "expert"): ["smoke_bt40_h32_v700_large_logits"],
    ("fused_linear_cross_entropy", "straightforward"): ["smoke_bt40_h32_v700_large_logits"],
    # tests/test_task_chunked_prefill_paged.py (the expert on the edge lengths: page size 8, groups of 3)
    ("chunked_prefill_paged", "expert"): ["smoke_t130_n8_h6x2_d16_bs8_edge"],
    # tests/test_task_fused_qkv_norm_rope_cache.py
    ("fused_qkv_norm_rope_cache", "expert"): ["smoke_t20_h2x2_d16_zero_padding"],
    ("fused_qkv_norm_rope_cache", "straightforward"): ["smoke_t6_h4x2_d32_decode"],
    # tests/test_task_lora_shrink_expand.py (the prefill path: two-phase sort, split-K; interleaved singleton)
    ("lora_shrink_expand", "expert"): ["smoke_t150_k128_s2_segmented"],
    ("lora_shrink_expand", "straightforward"): ["smoke_t40_k64_interleaved_singleton"],
    # tests/test_task_gated_deltanet_chunk_prefill.py
    ("gated_deltanet_chunk_prefill", "expert"): ["smoke_varlen_n3_h2x4_d32", "smoke_edge_strong_decay_n4"],
    ("gated_deltanet_chunk_prefill", "straightforward"): ["smoke_edge_strong_decay_n4"],
    # tests/test_task_mamba2_ssd_chunk_scan.py
    ("mamba2_ssd_chunk_scan", "expert"): ["smoke_varlen_n3_h4_g2_q64", "smoke_edge_extreme_dt_n4"],
    ("mamba2_ssd_chunk_scan", "straightforward"): ["smoke_edge_extreme_dt_n4"],
    # tests/test_task_sliding_window_prefill.py (the sink workloads: checked directly there)
    ("sliding_window_prefill", "expert"): ["smoke_b1_s50_h3x1_d16_w64_softcap"],
    ("sliding_window_prefill", "straightforward"): ["smoke_b1_s40_h2x2_d64_w1_sinks"],
    # tests/test_task_allreduce_residual_rmsnorm.py
    ("allreduce_residual_rmsnorm", "expert"): ["smoke_r4_t7_h384_quant", "smoke_r8_t9_h128_outliers",
                                              "smoke_r2_t3_h384_bf16_fp8"],
    ("allreduce_residual_rmsnorm", "straightforward"): ["smoke_r3_t6_h640_outliers_quant"],
    # tests/test_task_varlen_flash_prefill.py
    ("varlen_flash_prefill", "expert"): ["smoke_t160_n9_h3x1_d16_edge"],
    ("varlen_flash_prefill", "straightforward"): ["smoke_t126_n6_h2x1_d16_ladder"],
}


def param(task_id: str, solution: str, *values, id: str | None = None):  # noqa: A002 - pytest's name
    """``pytest.param(*values)`` (default: ``(task_id, solution)``) with the ``slow`` marker when
    the shared evaluation of ``(task_id, solution)`` is in :data:`HEAVY`."""
    marks = [pytest.mark.slow] if (task_id, solution) in HEAVY else []
    return pytest.param(*(values or ((task_id, solution),)), marks=marks, id=id or f"{task_id}/{solution}")


def _try_lock(f) -> bool:
    """Take the exclusive lock of open file ``f`` if no process holds it."""
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def needed(items) -> list[tuple[str, str]]:
    """The shared evaluations that the selected test items using the ``shipped`` fixture ask for,
    as far as their parameters say (``item``: a ``(task, solution)`` pair, as the false-positive
    tests take it), in the items' order."""
    pairs = []
    for it in items:
        if "shipped" not in getattr(it, "fixturenames", ()):
            continue  # e.g. the GPU variants, which take the same pairs but evaluate on their own
        p = getattr(getattr(it, "callspec", None), "params", {}).get("item")
        if isinstance(p, tuple) and p in _KNOWN and p not in pairs:
            pairs.append(p)
    return pairs


def workload_ids(task_id: str, solution: str) -> list[str]:
    """The smoke workloads of one shipped solution's shared evaluation, in the task's order.

    The reference (trusted, fast) runs on every smoke workload; a Triton solution on its first
    timed smoke workload plus the ones in :data:`ASSERTED` (every smoke workload with
    ``D2K_FP_ALL_SMOKE=1``).

    Raises:
        ValueError: a workload of :data:`ASSERTED` that the task does not have.
    """
    wls = list(load_task(task_id).spec.smoke_workloads)
    known = {w.id for w in wls}
    wanted = set(ASSERTED.get((task_id, solution), []))
    if wanted - known:
        raise ValueError(f"tests/shipped.py ASSERTED: {task_id} has no smoke workload {sorted(wanted - known)}")
    if ALL_SMOKE or solution == "reference":
        return [w.id for w in wls]
    first = [w for w in wls if not w.correctness_only][:1] or wls[:1]
    wanted.add(first[0].id)
    return [w.id for w in wls if w.id in wanted]


def options(solution: str) -> Options:
    """The options of a shared evaluation (every integrity defence on in both cases).

    The reference is trusted (no worker monitors): one correctness call per workload shows it is
    not flagged. A Triton solution gets the full protocol: two correctness calls on fresh inputs,
    the sensitivity call, one CPU timing sample and the re-check of the timed outputs.
    """
    if solution == "reference":
        return Options(timeout_s=300, check_calls=1, time_solutions=False)
    return Options(timeout_s=300, check_calls=2, cpu_samples=1)


def _evaluate(task_id: str, solution: str) -> Evaluation:
    task = load_task(task_id)
    wls = [task.spec.workload(w) for w in workload_ids(task_id, solution)]
    ev = evaluate(task, solution, wls, "cpu", None, options=options(solution))
    if external_edit_only(ev):  # someone edited the shared working tree during the run: once more
        ev = evaluate(task, solution, wls, "cpu", None, options=options(solution))
    return ev


class ShippedEvaluations:
    """The shared evaluations of one test session, kept as files under ``root``.

    ``get(task_id, solution)`` evaluates on the first request in the session (any worker) and
    answers from the file afterwards; a request while another worker evaluates the same solution
    waits for that worker's answer. ``waited_s`` and ``evaluated`` say what this process did.
    """

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._memo: dict[tuple[str, str], Evaluation] = {}
        self.evaluated: list[tuple[str, str, float]] = []
        self.waited_s = 0.0
        #: Evaluations this session's selected tests will ask for (:func:`needed`), done while
        #: waiting for another worker's evaluation.
        self.backlog: list[tuple[str, str]] = []

    def get(self, task_id: str, solution: str) -> Evaluation:
        """The session's evaluation of ``solution`` (``reference``, ``straightforward`` or
        ``expert``) of ``task_id`` on :func:`workload_ids` with :func:`options`.

        While another worker holds this evaluation, this one evaluates a pending one of
        :attr:`backlog` (one no process has started) instead of leaving its core idle.

        Raises:
            RuntimeError: the evaluation raised (in whichever worker ran it); the message
                carries that exception.
        """
        key = (task_id, solution)
        if key in self._memo:
            return self._memo[key]
        out, err = self._files(task_id, solution)
        t0 = time.perf_counter()
        with open(self.root / f"{task_id}.{solution}.lock", "w") as lock:
            helped = 0.0
            while not _try_lock(lock):   # another worker evaluates it: do a pending one meanwhile
                spent = self._evaluate_pending()
                if spent is None:
                    fcntl.flock(lock, fcntl.LOCK_EX)   # nothing else to do: wait for its answer
                    break
                helped += spent
            self.waited_s += time.perf_counter() - t0 - helped
            self._evaluate_into(task_id, solution)
        if err.exists():
            raise RuntimeError(f"the harness raised evaluating {task_id}/{solution}: {err.read_text()}")
        ev = Evaluation.model_validate_json(out.read_text())
        self._memo[key] = ev
        return ev

    def _files(self, task_id: str, solution: str) -> tuple[Path, Path]:
        return self.root / f"{task_id}.{solution}.json", self.root / f"{task_id}.{solution}.error"

    def _evaluate_into(self, task_id: str, solution: str) -> None:
        """Evaluate into the shared files unless some process already did (the lock is held)."""
        out, err = self._files(task_id, solution)
        if out.exists() or err.exists():
            return
        t1 = time.perf_counter()
        try:
            text = _evaluate(task_id, solution).model_dump_json()
        except Exception as e:  # noqa: BLE001 - every test of this solution reports it
            err.write_text(f"{type(e).__name__}: {e}")
        else:
            tmp = out.with_suffix(".tmp")
            tmp.write_text(text)
            os.replace(tmp, out)
        self.evaluated.append((task_id, solution, time.perf_counter() - t1))

    def _evaluate_pending(self) -> float | None:
        """Evaluate one evaluation of :attr:`backlog` that no process holds or has finished and
        return its seconds; None when there is none."""
        while self.backlog:
            task_id, solution = self.backlog.pop(0)
            out, err = self._files(task_id, solution)
            if out.exists() or err.exists():
                continue
            with open(self.root / f"{task_id}.{solution}.lock", "w") as lock:
                if not _try_lock(lock):
                    continue  # another process has it
                t = time.perf_counter()
                self._evaluate_into(task_id, solution)
                return time.perf_counter() - t
        return None

    def write_stats(self, worker: str) -> None:
        """``stats-<worker>.json`` in the shared folder: this process's evaluations (task,
        solution, seconds) and its seconds spent waiting for another process's evaluation."""
        (self.root / f"stats-{worker}.json").write_text(json.dumps({"evaluated": self.evaluated,
                                                                     "waited_s": self.waited_s}))

    @staticmethod
    def summary(root: Path) -> str:
        """One line summing every process's ``stats-*.json`` under ``root`` ("" when none)."""
        stats = [json.loads(p.read_text()) for p in sorted(Path(root).glob("stats-*.json"))] if Path(root).is_dir() else []
        if not stats:
            return ""
        evaluated = [e for s in stats for e in s["evaluated"]]
        waited = sum(s["waited_s"] for s in stats)
        slowest = sorted(evaluated, key=lambda e: -e[2])[:3]
        return (f"shared evaluations of shipped solutions: {len(evaluated)} in {sum(e[2] for e in evaluated):.0f} s "
                f"(slowest: {', '.join(f'{t}/{s} {sec:.0f} s' for t, s, sec in slowest)}); "
                f"workers waited {waited:.0f} s for one another's")

    def results(self, task_id: str, solution: str, workloads: list[str]) -> list[WorkloadResult]:
        """The shared evaluation's results on ``workloads`` (each must be in :data:`ASSERTED`).

        Raises:
            KeyError: a workload the shared evaluation did not run (add it to :data:`ASSERTED`).
        """
        by_id = {r.workload: r for r in self.get(task_id, solution).candidate.results}
        missing = [w for w in workloads if w not in by_id]
        if missing:
            raise KeyError(f"{task_id}/{solution}: the shared evaluation did not run {missing}: "
                           "add them to ASSERTED in tests/shipped.py")
        return [by_id[w] for w in workloads]


def flagged(ev: Evaluation) -> list[str]:
    """One line per workload of ``ev``'s candidate that did not pass or has any integrity
    violation (empty: nothing flagged)."""
    return [f"{r.workload}: {r.status.value}: {r.cause[:200]}; violations {[(v.rule, v.evidence[:120]) for v in r.violations]}"
            for r in ev.candidate.results if r.status.value != "ok" or r.violations]


def assert_not_flagged(item: tuple[str, str], ev: Evaluation) -> None:
    """Zero false positives of the shipped solution ``item`` = (task, solution) in its shared
    evaluation ``ev``: no workload flagged, and for a Triton solution the integrity protocol
    really ran (a timed smoke workload, a passed sensitivity call, the timed outputs re-checked
    where the task has no state updates).

    Raises:
        AssertionError: what was flagged, or which part of the protocol did not run.
    """
    assert not flagged(ev), flagged(ev)
    res = [r for r in ev.candidate.results if not r.correctness_only]
    if item[1] != "reference":  # the integrity protocol really ran: sensitivity call and timed outputs
        assert res, "no timed smoke workload ran"
        assert any(c.name == "sensitivity" and c.passed for r in ev.candidate.results for c in r.integrity_checks)
        mutable = any(getattr(a, "mutable", False) for a in load_task(item[0]).spec.args)
        if not mutable:  # timed outputs of tasks with state updates are not re-checked (their state drifts)
            assert all(any(c.name.startswith("timed#") for c in r.integrity_checks) for r in res)
