"""The verdict of one call and of one workload: every check of an answer (:func:`check_reply`),
the status that follows (:func:`status_of`), one summary of a failed check
(:func:`first_failure`), :class:`WorkerFailure` (a request the worker failed), and
:class:`Checker`, the same checks as two calls for the integrity protocol's extra calls
(:mod:`d2kbench.integrity.parent`).
"""

from __future__ import annotations

import inspect

from d2kbench.checking import checks
from d2kbench.checking.expected import Expected
from d2kbench.results import CheckResult, Status, Violation
from d2kbench.tasks.schema import TensorArg, Workload

#: FP64-oracle slices per tolerance on the integrity protocol's extra calls (see :class:`Expected`).
EXTRA_CALL_ORACLE_SLICES = 1


class WorkerFailure(Exception):
    """The worker failed a request: ``status`` is a Status value, ``cause`` says why."""

    def __init__(self, status: str, cause: str, violations: list[dict] | None = None):
        super().__init__(f"{status}: {cause}")
        self.status = status
        self.cause = cause
        self.violations = list(violations or [])  # integrity findings ({"rule", "evidence"})


def first_failure(results: list[CheckResult]) -> str:
    """``name error X > T detail`` of the first failed check ("" when all passed)."""
    bad = [r for r in results if not r.passed]
    if not bad:
        return ""
    r = bad[0]
    err = f" error {r.error:.3e} > {r.threshold:.3e}" if r.error is not None and r.threshold is not None else ""
    return f"{r.name}{err} {r.detail}".strip()


def status_value(value: str) -> Status:
    """A status reported by a worker, as a :class:`Status` (unknown values: runtime_error)."""
    return Status(value) if value in Status._value2member_map_ else Status.RUNTIME_ERROR


def check_reply(call: int, spec, wl: Workload, reference, args: list, expected: Expected,
                reply: dict, slack: float = 1.0) -> tuple[list[CheckResult], list[Violation]]:
    """All checks of one call: structure, finiteness, tolerances, state updates, untouched inputs,
    plus the integrity evidence the worker reported (aliases, tensor subclasses).

    ``slack`` (>= 1) widens every tolerance by that factor (:meth:`Tolerance.widened`): the
    sensitivity call's inputs lie off the workload's distribution (docs/integrity.md)."""
    results, violations = [], []
    outs = [o.clone() if o is not None else None for o in reply["outputs"]]
    if not spec.outputs and reply.get("container") == "NoneType":
        outs = []  # an in-place operator (no declared outputs) may return None as well as ()
    for evidence in reply.get("aliases", []):
        violations.append(Violation(rule="no_aliasing", evidence=evidence))
    for k, (sub, tname) in enumerate(zip(reply["subclass"], reply["types"])):
        if sub:
            violations.append(Violation(rule="exact_tensor_type", evidence=f"output {k} is a {tname}, not torch.Tensor"))
    if len(outs) != len(spec.outputs):
        results.append(CheckResult(call=call, name="outputs:count", passed=False,
                                   detail=f"returned {len(outs)} outputs ({reply.get('container')}), "
                                          f"expected {len(spec.outputs)}"))
        return results, violations
    container = spec.container_problem(reply.get("container"))  # the contract's return type (TaskSpec)
    if container:
        results.append(CheckResult(call=call, name="outputs:container", passed=False, detail=container))
        return results, violations
    ref_outs, ref_state = expected.reference()

    def apply(name, shape, tol, out, ref_value, out_index, before=None) -> CheckResult:
        exp = ref_value
        if tol.against == "oracle":
            if out_index is None:
                raise ValueError("oracle checks apply to outputs only")
            sample, oracle_outs = expected.oracle(tol)
            exp = oracle_outs[out_index]
            if sample is not None:
                out = out.index_select(shape.index(sample[0]), sample[1].to(out.device))
        custom = None
        if tol.metric == "custom" and getattr(reference, "check", None) is not None:
            custom = lambda: custom_check(reference, expected.pristine, outs, name)  # noqa: E731
        return checks.compare(call, name, tol, out, exp, shape.index, custom, before)

    for k, (ospec, out) in enumerate(zip(spec.outputs, outs)):
        if out is None:
            results.append(CheckResult(call=call, name=f"{ospec.name}:structure", passed=False,
                                       detail=f"{ospec.name} is {reply['types'][k]}, expected torch.Tensor"))
            continue
        st = checks.structure(call, ospec, out, wl, (reply.get("strides") or [None] * len(outs))[k])
        results.append(st)
        if not st.passed:
            continue
        results.append(checks.finite(call, ospec.name, out))
        for tol in wl.checks_for(ospec.name, ospec.checks):
            results.append(apply(ospec.name, ospec.shape, tol.widened(slack), out, ref_outs[k], k))
    for i, (aspec, now) in enumerate(zip(spec.args, args)):
        if not isinstance(aspec, TensorArg):
            continue
        if aspec.mutable:
            for tol in wl.checks_for(aspec.name, spec.state_checks[aspec.name]):
                results.append(apply(f"state:{aspec.name}", aspec.shape, tol.widened(slack), now, ref_state[i], None,
                                     expected.pristine[i]))
        elif aspec.count is not None:  # a tensor list: every element untouched
            results += [checks.untouched(call, f"{aspec.name}[{r}]", t, b) for r, (t, b) in
                        enumerate(zip(now, expected.pristine[i]))]
        else:
            results.append(checks.untouched(call, aspec.name, now, expected.pristine[i]))
    return results, violations


def status_of(checks_: list[CheckResult], violations: list[Violation]) -> tuple[Status, str]:
    if violations:
        return Status.INTEGRITY_VIOLATION, f"{violations[0].rule}: {violations[0].evidence}"
    failed = [c for c in checks_ if not c.passed]
    if failed:
        c = failed[0]
        return Status.INCORRECT, f"call {c.call}: {first_failure([c])}"
    return Status.OK, ""


def custom_check(reference, inputs: list, outputs: list, name: str) -> tuple[bool, float | None, str]:
    """The task's custom check of output ``name``: ``reference.check(inputs, outputs)`` on the
    pristine ``inputs`` and every output of the call (a property check of a sample, a set or an
    order), with ``output=name`` when the check takes it (per-output property checks).

    Returns:
        ``(passed, error or None, detail)`` as the task's check returns it.

    Raises:
        AttributeError: the reference defines no ``check``.
    """
    fn = reference.check
    named = "output" in inspect.signature(fn).parameters
    return fn(inputs, outputs, **({"output": name} if named else {}))


class Checker:
    """The harness's checks of one workload as two calls: ``expected(pristine)`` (reference
    outputs and states) and ``check(call, args, pristine, reply)`` (results, violations).

    Expected values are computed once per input list (kept by identity), so the sensitivity
    call's reference run on the perturbed inputs also serves its check; :meth:`adopt` reuses
    the expected values a correctness call already computed."""

    def __init__(self, task, reference, workload):
        self.task = task
        self.ref = reference
        self.wl = workload
        self.spec = task.spec
        self._cache: dict[tuple[int, int], tuple[list, Expected]] = {}

    def adopt(self, pristine: list, expected: Expected) -> None:
        """Use ``expected`` (the expected values of ``pristine``) instead of computing them again."""
        self._cache[(id(pristine), 1)] = (pristine, expected)

    def forget(self, pristine: list) -> None:
        """Drop the expected values of ``pristine`` (and the reference to it): a rejected change of
        the sensitivity call would otherwise hold one more copy of every input on the device."""
        for key in [k for k, (args, _) in self._cache.items() if args is pristine]:
            del self._cache[key]

    def _expected(self, pristine: list, repeats: int = 1) -> Expected:
        hit = self._cache.get((id(pristine), repeats))
        if hit is None or hit[0] is not pristine:
            hit = (pristine, Expected(self.task, self.ref, self.wl, pristine, oracle_cap=EXTRA_CALL_ORACLE_SLICES,
                                      repeats=repeats))
            self._cache[(id(pristine), repeats)] = hit
        return hit[1]

    def expected(self, pristine: list) -> tuple[list, list]:
        """(reference outputs, argument states after the reference ran) on ``pristine``."""
        return self._expected(pristine).reference()

    def check(self, call: int, args: list, pristine: list, reply: dict,
              repeats: int = 1, slack: float = 1.0) -> tuple[list[CheckResult], list[Violation]]:
        """Every check of one answer (``args``: the arguments after the call; ``repeats``: how
        many times the call ran on the same arguments, so a state update applied that often;
        ``slack``: tolerances widened by that factor, see :func:`check_reply`)."""
        return check_reply(call, self.spec, self.wl, self.ref, args, self._expected(pristine, repeats), reply,
                           slack)
