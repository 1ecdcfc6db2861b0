"""Integrity checks that run in the trusted parent (:mod:`d2kbench.harness.evaluate`).

The parent never runs solution code, so these checks cannot be tampered with:

* :func:`static_violations` (re-exported): the AST rules, once per solution;
* :func:`sensitivity_check`: one more call whose inputs equal the previous call's except one
  secretly chosen element, changed enough to move the reference output beyond tolerance; the
  output must follow (``stale_output`` when it stays bit-identical, ``incorrect`` otherwise);
* :func:`check_timed_outputs`: outputs the worker kept from a secretly chosen timed call and
  from the last one, checked like any correctness call (``timed_output``);
* :func:`check_graph_verify`: CUDA-graph replays on rewritten inputs (``graph_replay``);
* :func:`below_sol_floor`: a time below the task's roofline floor (``below_sol_floor``);
* :class:`FileWatch`: content hashes of the harness and task files (``harness_tampering``).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from d2kbench.checking import checks
from d2kbench.checking.expected import Expected
from d2kbench.checking.inputs import clone_args, make_args
from d2kbench.checking.verdict import Checker, WorkerFailure, custom_check, first_failure
from d2kbench.integrity.ops import finite_abs_max
from d2kbench.integrity.static import static_violations  # noqa: F401 - re-exported
from d2kbench.results import CheckResult, TimingStats, Violation
from d2kbench.scoring.sol import DATASHEET, gpu_key, sol_ms
from d2kbench.tasks.schema import TensorArg

#: Labels of the extra calls in CheckResult.call (the regular calls are 0..check_calls).
SENSITIVITY_CALL = -1
TIMED_CALL = -2
GRAPH_CALL = -3


def _prefixed(results: list[CheckResult], prefix: str) -> list[CheckResult]:
    return [r.model_copy(update={"name": f"{prefix}:{r.name}"}) for r in results]


def _same_bits(a, b) -> bool:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return False
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool((checks.bit_pattern(a) == checks.bit_pattern(b)).all())


# ---------------------------------------------------------------------------------------------
# Sensitivity: changing one input element must change the output
# ---------------------------------------------------------------------------------------------
#: Tolerances on the sensitivity call are this many times wider than on a correctness call: a
#: single element moved to up to 8x the argument's largest magnitude lies off the workload's
#: distribution, where honest kernels leave the error the tolerance was calibrated on (measured:
#: the mla_decode_absorbed expert, 6.0e-4 at most over 12 seeds of its smoke workloads, reached
#: 1.13e-3 > 1.0e-3 on one sensitivity call).
SENSITIVITY_SLACK = 2.0
#: The change must move the reference output beyond this many times its tolerance, so that the
#: previous output, alone or with any noise a correctness call lets pass (below 1x), fails the
#: widened checks of the sensitivity call by a margin.
SENSITIVITY_STRENGTH = 2 * SENSITIVITY_SLACK
#: One element is moved by these factors of its argument's largest magnitude, in turn.
SENSITIVITY_FACTORS = (1.0, 2.0, 4.0, 8.0)
#: Then runs of this many consecutive elements are redrawn from their own tensor, in turn, where
#: one element cannot move the reference that far. Measured on the CPU (reference only, 10 input
#: sets each, runs moved by 8x): on fused_moe_fp8_block's smallest smoke workload, whose FP8
#: weights' products are rounded away, a run of 512 never moved the output 4x its tolerance, one
#: of 4096 did 4 times and one of 32768 9 times.
SENSITIVITY_RUNS = tuple(8 ** k for k in range(1, 7))


def _pick(args: list, spec_args: list, rng: secrets.SystemRandom):
    """(label, original tensor, copy of ``args``, flat view of the chosen tensor in the copy) for
    a secretly chosen floating-point tensor argument or element of a tensor-list argument
    (weighted by size, so every element is equally likely), or None when there is none (or it
    is not contiguous)."""
    cands: list[tuple[int, int | None, torch.Tensor]] = [
        (i, None, a) for i, (a, s) in enumerate(zip(args, spec_args))
        if isinstance(s, TensorArg) and isinstance(a, torch.Tensor) and a.is_floating_point() and a.numel()]
    cands += [(i, r, t) for i, (a, s) in enumerate(zip(args, spec_args)) if isinstance(s, TensorArg) and s.count
              and isinstance(a, list) for r, t in enumerate(a)
              if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()]
    if not cands:
        return None
    i, r, orig = rng.choices(cands, weights=[a.numel() for _, _, a in cands])[0]
    new = clone_args(args)
    chosen = new[i] if r is None else new[i][r]
    if not chosen.is_contiguous():
        return None
    label = spec_args[i].name if r is None else f"{spec_args[i].name}[{r}]"
    return label, orig, new, chosen.view(-1), spec_args[i].value_range


def _unravel(j: int, shape: tuple) -> list[int]:
    """The index of flat position ``j`` in a contiguous tensor of ``shape`` (row-major), in
    plain integers (``torch.unravel_index`` imports sympy on its first call: seconds per process)."""
    idx = []
    for d in reversed(shape):
        j, k = divmod(j, int(d))
        idx.append(k)
    return idx[::-1]


def _describe(name: str, shape: tuple, j: int, n: int, old: float, now: float) -> str:
    idx = _unravel(j, shape)
    more = f" and the next {n - 1} elements" if n > 1 else ""
    return f"{name}{idx}{more}: {old:.4g} -> {now:.4g}"


def perturb(args: list, spec_args: list, rng: secrets.SystemRandom, factor: float) -> tuple[list, str] | None:
    """A copy of ``args`` with one secretly chosen element of a secretly chosen floating-point
    tensor argument moved by about ``factor`` x the argument's largest magnitude (clamped to a
    quarter of the dtype's range), or redrawn inside the argument's ``value_range`` where the
    spec bounds its values. Returns ``(new_args, description)`` or None when no argument can be
    perturbed."""
    got = _pick(args, spec_args, rng)
    if got is None:
        return None
    label, orig, new, flat, bounds = got
    j = rng.randrange(flat.numel())
    old = float(flat[j].float())  # float32 arithmetic: FP8 tensors have no max/abs kernels
    if bounds is not None:
        target = rng.uniform(*bounds)
    else:
        lim = float(torch.finfo(flat.dtype).max) / 4
        target = max(-lim, min(lim, old + rng.choice((-1.0, 1.0)) * factor * finite_abs_max(orig)))
    flat[j:j + 1].copy_(torch.tensor([target], dtype=torch.float32))
    now = float(flat[j].float())
    if now == old or now != now:
        return None
    return new, _describe(label, tuple(orig.shape), j, 1, old, now)


def redraw(args: list, spec_args: list, rng: secrets.SystemRandom, run: int) -> tuple[list, str] | None:
    """A copy of ``args`` with ``run`` consecutive elements (in memory order, from a secret start;
    the whole tensor at most) of a secretly chosen floating-point tensor argument replaced by
    values of the same tensor drawn at random positions: the tensor keeps its distribution (no
    outliers, unlike :func:`perturb`) while the run's values change. Returns ``(new_args,
    description)`` or None when nothing can be changed (no argument, or the run drew the same
    values, as in a constant tensor)."""
    got = _pick(args, spec_args, rng)
    if got is None:
        return None
    label, orig, new, flat, _bounds = got  # values of the same tensor: inside its range already
    n = min(run, flat.numel())
    j = rng.randrange(flat.numel() - n + 1)
    gen = torch.Generator().manual_seed(rng.randrange(2 ** 63))
    src = torch.randint(0, flat.numel(), (n,), generator=gen).to(flat.device)
    bits = checks.bit_pattern(flat)  # a view (flat is contiguous): gathers of FP8 values have no kernels
    before = flat[j:j + n].clone()
    bits[j:j + n] = bits[src].clone()
    if bits[j:j + n].equal(before.view(bits.dtype)):
        return None
    return new, _describe(label, tuple(orig.shape), j, n, float(before[0].float()),
                          float(flat[j].float()))


def _moved_outputs(checker, ref_o: list, ref_p: list, p_args: list) -> list[int]:
    """The outputs whose reference values before the change (``ref_o``) fail a tolerance of the
    workload (reference or oracle, on the whole tensor), widened ``SENSITIVITY_STRENGTH`` times,
    against those after it (``ref_p``), and the other way round: the previous value of such an
    output, even with noise a correctness call lets pass, fails the sensitivity call's checks
    (whichever of the two norms is larger bounds the noise). An output checked by the task's
    custom check (a property check of a sample, a set, an order) moves when the reference's
    previous outputs fail that check on the changed inputs ``p_args``: an answer left unchanged
    would then fail it too."""
    spec = checker.spec
    moved = []
    for k, ospec in enumerate(spec.outputs):
        if k >= len(ref_o) or k >= len(ref_p):
            continue
        for tol in checker.wl.checks_for(ospec.name, ospec.checks):
            if tol.metric == "custom":
                if _custom_rejects(checker.ref, p_args, ref_o, ospec.name):
                    moved.append(k)
                    break
                continue
            wide = tol.widened(SENSITIVITY_STRENGTH)
            # both ways: relative errors are taken against the expected value, so a change that
            # shrinks the output could otherwise leave room for the old one plus noise
            if not checks.compare(0, ospec.name, wide, ref_o[k], ref_p[k], ospec.shape.index).passed and \
                    not checks.compare(0, ospec.name, wide, ref_p[k], ref_o[k], ospec.shape.index).passed:
                moved.append(k)
                break
    return moved


def _custom_rejects(reference, inputs: list, outputs: list, name: str) -> bool:
    """Whether the task's custom check (:func:`d2kbench.checking.verdict.custom_check`) rejects
    ``outputs`` on ``inputs``; False without such a check."""
    if getattr(reference, "check", None) is None:
        return False
    return not custom_check(reference, inputs, outputs, name)[0]


def sensitivity_check(request: Callable[[list], dict], checker, pristine: list, outputs: list
                      ) -> tuple[list[CheckResult], list[Violation]]:
    """One extra call on ``pristine`` (the previous call's inputs) with a secret change.

    The change grows (one element at :data:`SENSITIVITY_FACTORS` x the argument's largest
    magnitude, then :func:`redraw` runs of :data:`SENSITIVITY_RUNS` elements) until a reference
    output moves beyond :data:`SENSITIVITY_STRENGTH` x one of its tolerances
    (:func:`_moved_outputs`). The answer is checked like a correctness call with tolerances
    :data:`SENSITIVITY_SLACK` x wider (an outlier element lies off the workload's distribution),
    so the previous output, alone or with noise, fails. ``stale_output`` when such an output is
    bit-identical to ``outputs`` (the previous call's). When no change moves the reference that
    far, nothing is judged (a stale output could not be told from a correct one) and the check
    says so.
    """
    spec = checker.spec
    rng = secrets.SystemRandom()
    ref_o, _ = checker.expected(pristine)
    chosen = None
    changes = [lambda f=f: perturb(pristine, spec.args, rng, f) for f in SENSITIVITY_FACTORS]
    changes += [lambda n=n: redraw(pristine, spec.args, rng, n) for n in SENSITIVITY_RUNS]
    for change in changes:
        got = change()
        if got is None:
            continue
        p_args, desc = got
        ref_p, _ = checker.expected(p_args)
        finite = all(not isinstance(r, torch.Tensor) or not r.is_floating_point() or bool(checks.isfinite(r).all())
                     for r in ref_p)
        moved = _moved_outputs(checker, ref_o, ref_p, p_args) if finite else []
        if moved:
            chosen = (p_args, desc, ref_p, moved)
            break
        checker.forget(p_args)  # one rejected copy of the inputs at a time, not up to ten
    if chosen is None:
        return [CheckResult(call=SENSITIVITY_CALL, name="sensitivity", passed=True, detail=(
            f"neither one element at up to {SENSITIVITY_FACTORS[-1]:g}x the largest magnitude nor a redrawn run "
            f"of up to {SENSITIVITY_RUNS[-1]} elements moved the reference output beyond {SENSITIVITY_STRENGTH:g}x "
            "its tolerance; skipped"))], []
    p_args, desc, ref_p, moved = chosen
    sent = clone_args(p_args)
    reply = request(sent)
    results, violations = checker.check(SENSITIVITY_CALL, sent, p_args, reply, slack=SENSITIVITY_SLACK)
    violations += [Violation(**v) for v in reply.get("violations") or []]
    results = _prefixed(results, "sensitivity")
    outs = reply.get("outputs") or []
    for k, (now, before) in enumerate(zip(outs, outputs)):
        if k in moved and _same_bits(now, before):
            violations.append(Violation(rule="stale_output", evidence=(
                f"output {k} stayed bit-identical after input {desc} changed (the reference output moved beyond "
                f"{SENSITIVITY_STRENGTH:g}x its tolerance)")))
    results.append(CheckResult(call=SENSITIVITY_CALL, name="sensitivity", passed=not any(
        v.rule == "stale_output" for v in violations),
        detail=f"perturbed {desc}; reference outputs moved beyond {SENSITIVITY_STRENGTH:g}x tolerance: {moved}"))
    return results, violations


# ---------------------------------------------------------------------------------------------
# Outputs produced during timing and by CUDA-graph replays
# ---------------------------------------------------------------------------------------------
def check_timed_outputs(reply: dict, checker, reference, workload, seeds: list[int], device: str
                        ) -> tuple[list[CheckResult], list[Violation]]:
    """Check the outputs the worker kept from timed calls against inputs regenerated from the
    timing seeds (skipped for tasks with mutable arguments: their state drifts across calls)."""
    spec = checker.spec
    if any(isinstance(a, TensorArg) and a.mutable for a in spec.args):
        return [], []
    results, violations = [], []
    for item in reply.get("stashed") or []:
        j = int(item.get("set", -1))
        if not 0 <= j < len(seeds):
            violations.append(Violation(rule="timed_output", evidence=f"worker reported an unknown input set {j}"))
            continue
        args = make_args(reference, spec, workload, seeds[j], device)
        r, v = checker.check(TIMED_CALL, args, clone_args(args), item)
        r = _prefixed(r, f"timed#{item.get('ordinal')}")
        results += r
        violations += v
        fail = first_failure(r)
        if fail:
            violations.append(Violation(rule="timed_output", evidence=(
                f"timed call #{item.get('ordinal')} on input set {j} failed {fail}; the correctness calls passed")))
    return results, violations


def check_graph_verify(reply: dict, checker, reference, workload, verify_seed: int | None, device: str
                       ) -> tuple[list[CheckResult], list[Violation]]:
    """Check CUDA-graph replays: the last timed replay (inputs perturbed every replay) and one
    replay on freshly rewritten inputs with NaN-poisoned outputs."""
    payload = reply.get("graph_verify") or {}
    spec = checker.spec
    mutable = any(isinstance(a, TensorArg) and a.mutable for a in spec.args)
    # a replay runs set 0 several times (every pass over the input sets): a state update is applied
    # that often, so the expected state and outputs are the reference's after as many calls
    passes = int(payload.get("passes") or 1) if mutable else 1
    results, violations = [], []
    for key, item in payload.items():
        if not isinstance(item, dict):
            continue
        if key == "fresh" and verify_seed is not None:
            pristine = make_args(reference, spec, workload, verify_seed, device)
        elif key == "last_replay" and not mutable:
            pristine = clone_args(item["args"])
        else:
            continue
        r, v = checker.check(GRAPH_CALL, item["args"], pristine, item, repeats=passes)
        r = _prefixed(r, f"graph:{key}")
        results += r
        violations += v
        fail = first_failure(r)
        if fail:
            what = "a replay on freshly rewritten inputs (outputs poisoned with NaN first)" if key == "fresh" \
                else "the last timed replay (one input element changed before every replay)"
            violations.append(Violation(rule="graph_replay", evidence=f"{what} failed {fail}"))
    return results, violations


def stats_inconsistency(stats: TimingStats) -> str:
    """Why the reported statistics are not those of the reported samples ("" when they are):
    the parent recomputes n, mean, median, min and max from ``samples_ms``."""
    x = np.asarray(stats.samples_ms, dtype=np.float64)
    if x.size != stats.n or x.size == 0:
        return f"n={stats.n} but {x.size} samples"
    for name, want, got in (("mean", x.mean(), stats.mean_ms), ("median", np.median(x), stats.median_ms),
                            ("min", x.min(), stats.min_ms), ("max", x.max(), stats.max_ms)):
        if abs(want - got) > 1e-9 + 1e-6 * abs(want):
            return f"{name} reported {got:.6g} ms, samples give {want:.6g} ms"
    return ""


# ---------------------------------------------------------------------------------------------
# Roofline floor
# ---------------------------------------------------------------------------------------------
def below_sol_floor(task, workload, timing: TimingStats | None, gpu_name: str | None) -> Violation | None:
    """``below_sol_floor`` when the timed mean or median is below the SOL time of the task's
    ``sol.floor`` variant at the GPU's *datasheet* peaks (the least work any known design needs,
    at rates no kernel can exceed). None on the CPU or an unknown GPU."""
    if timing is None or not gpu_name:
        return None
    key = gpu_key(gpu_name)
    if key is None:
        return None
    sol = task.spec.sol
    floor_ms, bind = sol_ms(sol.counts(sol.floor), workload.axes, DATASHEET[key])
    t = min(timing.mean_ms, timing.median_ms)
    if floor_ms > 0 and t < floor_ms:
        return Violation(rule="below_sol_floor", evidence=(
            f"timed {t * 1e3:.2f} us (mean {timing.mean_ms * 1e3:.2f}, min {timing.min_ms * 1e3:.2f}) is below the "
            f"roofline floor {floor_ms * 1e3:.2f} us of variant {sol.floor!r} ({bind}-bound at {key} datasheet peaks)"))
    return None


# ---------------------------------------------------------------------------------------------
# Harness files
# ---------------------------------------------------------------------------------------------
def harness_files(task_root: Path | None = None) -> list[Path]:
    """The files a worker imports or reads that decide results: the harness, integrity, sandbox,
    task loading and scoring code, and the task's ``task.yaml`` and ``reference.py``."""
    pkg = Path(__file__).resolve().parents[1]
    files = [p for sub in ("harness", "checking", "integrity", "sandbox", "tasks", "scoring")
             for p in sorted((pkg / sub).glob("*.py"))]
    files += [pkg / "__init__.py", pkg / "phases.py"]
    if task_root is not None:
        files += [Path(task_root) / "task.yaml", Path(task_root) / "reference.py"]
    return [f for f in files if f.is_file()]


class FileWatch:
    """Content hashes of files, re-checked after every workload. A change is reported once
    (to the workload that ran just before) and then becomes the new baseline."""

    def __init__(self, files: list[Path]):
        self.files = list(files)
        self.hashes = {f: self._hash(f) for f in self.files}

    @staticmethod
    def _hash(path: Path) -> str | None:
        try:
            return hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            return None

    def changes(self) -> list[Violation]:
        """``harness_tampering`` violations for files whose content changed since the last call."""
        out = []
        for f in self.files:
            now = self._hash(f)
            if now != self.hashes[f]:
                out.append(Violation(rule="harness_tampering", evidence=f"{f} changed during the evaluation "
                                     f"(sha256 {str(self.hashes[f])[:12]} -> {str(now)[:12]})"))
                self.hashes[f] = now
        return out


class ParentGuard:
    """The parent's integrity state for one solution of one evaluation; the harness calls its
    hooks from :class:`d2kbench.harness.workload.WorkloadRun`."""

    def __init__(self, task, solution_path: Path, device: str, trusted: bool, static: bool = True,
                 sensitivity: bool = True, files: FileWatch | None = None):
        self.task = task
        self.trusted = trusted
        self.device = device
        self.sensitivity_on = sensitivity and not trusted
        self.static = [] if trusted or not static else static_violations(solution_path, task.spec.forbidden.modules)
        self.files = files
        self.gpu_name = torch.cuda.get_device_name(0) if device == "cuda" and torch.cuda.is_available() else None
        self._last: tuple[list, list, Expected | None] | None = None  # (inputs, outputs, expected) of the last check call

    def on_reply(self, call: int, reply: dict, pristine: list, last: bool,
                 expected: Expected | None = None) -> list[Violation]:
        """Violations of one correctness answer beyond the output checks: the worker's findings
        (plus the static findings with call 0). Keeps the last check call's inputs, outputs and
        expected values (``expected``, a ``Expected`` of ``pristine``) for :meth:`sensitivity`."""
        out = [Violation(**v) for v in reply.get("violations") or []]
        if call == 0:
            out += self.static
        if last:
            self._last = (pristine, [o.clone() if isinstance(o, torch.Tensor) else None for o in reply["outputs"]],
                          expected)
        return out

    def sensitivity(self, request: Callable[[list], dict], reference, workload
                    ) -> tuple[list[CheckResult], list[CheckResult], list[Violation]]:
        """(failed checks, all checks, violations) of the sensitivity call (empty when off)."""
        if not self.sensitivity_on or self._last is None:
            return [], [], []
        pristine, outputs, expected = self._last
        self._last = None
        checker = Checker(self.task, reference, workload)
        if expected is not None:
            checker.adopt(pristine, expected)
        try:
            results, violations = sensitivity_check(request, checker, pristine, outputs)
        except WorkerFailure:
            raise
        except Exception as e:  # noqa: BLE001 - a defect of this check must not end the evaluation
            return [], [CheckResult(call=SENSITIVITY_CALL, name="sensitivity:skipped", passed=True,
                                    detail=f"check failed internally: {type(e).__name__}: {e}"[:300])], []
        return [r for r in results if not r.passed], results, violations

    def time_request_extra(self) -> dict:
        """Secret fields of the ``time`` request: the stash seed, fresh profile seeds, the graph
        verification seed (the worker cannot predict any of them)."""
        if self.trusted:
            return {}
        return {"integrity": {"stash_seed": secrets.randbits(63), "profile_seeds": [secrets.randbits(63) for _ in range(3)],
                              "verify_seed": secrets.randbits(63)}}

    def after_timing(self, reply: dict, reference, workload, seeds: list[int], extra: dict
                     ) -> tuple[list[CheckResult], list[Violation]]:
        """Everything the parent checks in a ``timing`` answer (worker findings included)."""
        violations = [Violation(**v) for v in reply.get("violations") or []]
        if self.trusted:
            return [], violations
        checker = Checker(self.task, reference, workload)
        verify_seed = (extra.get("integrity") or {}).get("verify_seed")
        r1: list[CheckResult] = []
        r2: list[CheckResult] = []
        v1: list[Violation] = []
        v2: list[Violation] = []
        try:
            r1, v1 = check_timed_outputs(reply, checker, reference, workload, seeds, self.device)
            r2, v2 = check_graph_verify(reply, checker, reference, workload, verify_seed, self.device)
        except Exception as e:  # noqa: BLE001 - a defect of these checks must not end the evaluation
            r1.append(CheckResult(call=TIMED_CALL, name="timed:skipped", passed=True,
                                  detail=f"check failed internally: {type(e).__name__}: {e}"[:300]))
        violations += v1 + v2
        stats = TimingStats.model_validate(reply["stats"])
        bad = stats_inconsistency(stats)
        if bad:
            violations.append(Violation(rule="forged_answer", evidence=f"timing statistics do not match their samples: {bad}"))
        floor = below_sol_floor(self.task, workload, stats, self.gpu_name)
        if floor is not None:
            violations.append(floor)
        return r1 + r2, violations

    @staticmethod
    def from_failure(failure) -> list[Violation]:
        """The integrity findings a failed request carried (e.g. a blocked operation)."""
        return [Violation(**v) for v in getattr(failure, "violations", None) or []]

    def after_workload(self) -> list[Violation]:
        """File-hash changes since the previous workload (only for untrusted solutions)."""
        return self.files.changes() if self.files is not None and not self.trusted else []


def make_guards(task, paths: dict[str, Path], device: str, *, static: bool = True,
                sensitivity: bool = True) -> dict[str, ParentGuard]:
    """One :class:`ParentGuard` per solution label.

    ``paths`` maps labels to solution files; the task's trusted code (``reference.py`` and its
    declared alternatives, :meth:`d2kbench.tasks.loader.Task.is_trusted`) gets no static rules,
    sensitivity call or timed-output checks. ``static=False`` leaves out the AST rules,
    ``sensitivity=False`` the sensitivity call."""
    files = FileWatch(harness_files(task.root))
    return {label: ParentGuard(task, path, device, trusted=task.is_trusted(path), static=static,
                               sensitivity=sensitivity, files=files)
            for label, path in paths.items()}


def external_edit_only(evaluation) -> bool:
    """True when the only findings of an evaluation's candidate are file-hash changes of the
    harness (someone edited the working tree during the run, which the hash cannot tell apart
    from tampering); tests and ``d2k evil`` run such an evaluation once more."""
    vs = [v for r in evaluation.candidate.results for v in r.violations]
    return bool(vs) and all(v.rule == "harness_tampering" and "changed during the evaluation" in v.evidence for v in vs)
