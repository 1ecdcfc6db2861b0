"""``d2k validate``: every rule of the task contract (docs/tasks.md) that can be checked statically
or by running the reference on the smoke workloads on the CPU.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import torch

from d2kbench.checking.checks import structure
from d2kbench.checking.inputs import make_args, output_shape, torch_dtype
from d2kbench.tasks.formula import FormulaError, evaluate_formula
from d2kbench.tasks.loader import REQUIRED_FILES, SUITE_DIR, TaskFileError, import_file, list_tasks, load_task

# Imports inside functions: the harness (and torch) load only for the smoke evaluation, not for the static rules.

REQUIRED_SOLUTIONS = ("expert", "straightforward")


def _signature(path: Path) -> inspect.Signature:
    mod = import_file(path)
    fn = getattr(mod, "run", None)
    if not callable(fn):
        raise ValueError("defines no callable run()")
    return inspect.signature(fn)


def _same_signature(a: inspect.Signature, b: inspect.Signature) -> bool:
    def key(s: inspect.Signature):
        return [(p.name, p.kind, p.default) for p in s.parameters.values()]

    return key(a) == key(b)


def validate_task(task_id: str | Path, run_smoke: bool = True, run_alternatives: bool = True) -> list[str]:
    """Problems of one task folder, each ``file: field: problem`` (empty when valid).

    ``run_smoke`` runs the reference on the smoke workloads (CPU); ``run_alternatives`` (with
    ``run_smoke``) also runs the alternatives declared for the CPU there, checked like solutions
    (``torch.compile`` alternatives compile, which takes seconds per workload)."""
    try:
        task = load_task(task_id)
    except TaskFileError as e:
        return str(e).splitlines()
    root, spec, problems = task.root, task.spec, []
    for name in REQUIRED_FILES:
        if not (root / name).is_file():
            problems.append(f"{root / name}: file is missing")
    for name in REQUIRED_SOLUTIONS:
        if not (root / "solutions" / f"{name}.py").is_file():
            problems.append(f"{root / 'solutions' / (name + '.py')}: file is missing")
    for loader, fname in ((lambda: task.guidance, "guidance.yaml"), (lambda: task.rubric, "rubric.yaml")):
        try:
            doc = loader()
            if doc.task != spec.id:
                problems.append(f"{root / fname}: task: {doc.task!r} differs from {spec.id!r}")
        except TaskFileError as e:
            problems.extend(str(e).splitlines())
    if not any(p.startswith(str(root / "guidance.yaml")) or p.startswith(str(root / "rubric.yaml")) for p in problems):
        ids = {i.id for i in task.guidance.items}
        for level in ("L1", "L2", "L3"):
            for prop in getattr(task.rubric, level).properties:
                for ref in prop.guidance:
                    if ref not in ids:
                        problems.append(f"{root / 'rubric.yaml'}: {level}.{prop.id}.guidance: unknown guidance id {ref!r}")
    try:
        ref_sig = _signature(root / "reference.py")
        names = [p for p in ref_sig.parameters]
        if names != [a.name for a in spec.args]:
            problems.append(f"{root / 'reference.py'}: run: parameters {names} differ from task.yaml args "
                            f"{[a.name for a in spec.args]}")
        tpl_sig = _signature(root / "template.py")
        if not _same_signature(ref_sig, tpl_sig):
            problems.append(f"{root / 'template.py'}: run: signature {tpl_sig} differs from the reference's {ref_sig}")
        problems.extend(_alternative_signatures(task, ref_sig))
    except Exception as e:  # noqa: BLE001 - report, do not crash the validator
        problems.append(f"{root}: run signature: {type(e).__name__}: {e}")
    for w in spec.all_workloads():
        for vname in ("reference", *spec.sol.variants):
            c = spec.sol.counts(vname)
            for field in ("tc_flops", "fp32_flops", "bytes"):
                try:
                    v = evaluate_formula(getattr(c, field), w.axes)
                    if v < 0:
                        problems.append(f"{root / 'task.yaml'}: sol.{vname}.{field}: negative on workload {w.id}")
                except FormulaError as e:
                    problems.append(f"{root / 'task.yaml'}: sol.{vname}.{field}: {e}")
    if run_smoke and not problems:
        problems.extend(_run_smoke(task))
    if run_smoke and run_alternatives and not problems:
        problems.extend(_run_alternatives(task))
    return problems


def _alternative_signatures(task, ref_sig: inspect.Signature) -> list[str]:
    """Every alternative file defines ``run`` with exactly the reference's signature
    (``compile_reference`` alternatives compile the reference itself and have no file)."""
    problems = []
    for i, alt in enumerate(task.spec.alternatives):
        if alt.file is None:
            continue
        where = f"{task.root / alt.file}: alternatives.{i} ({alt.name})"
        try:
            sig = _signature(task.root / alt.file)
        except Exception as e:  # noqa: BLE001 - report, do not crash the validator
            problems.append(f"{where}: {type(e).__name__}: {e}")
            continue
        if not _same_signature(ref_sig, sig):
            problems.append(f"{where}: run: signature {sig} differs from the reference's {ref_sig}")
    return problems


def _run_alternatives(task) -> list[str]:
    """Evaluate every alternative declared for the CPU on every smoke workload through the
    harness (a sandboxed worker, one correctness call each, checked like a solution; no
    timing), so that what it prints, compilers' warnings included, goes to its worker's log."""
    from d2kbench.harness.evaluate import Options, evaluate

    problems = []
    for i, alt in enumerate(task.spec.alternatives):
        if "cpu" not in alt.devices:
            continue
        where = f"{task.root / 'task.yaml'}: alternatives.{i} ({alt.name})"
        try:
            ev = evaluate(task, f"alt:{alt.name}", list(task.spec.smoke_workloads), "cpu", None,
                          options=Options(check_calls=1, time_solutions=False, integrity=False))
        except Exception as e:  # noqa: BLE001 - report, do not crash the validator
            problems.append(f"{where}: {type(e).__name__}: {e}")
            continue
        problems += [f"{where}: smoke workload {r.workload}: {r.status.value}: {r.cause}"
                     for r in ev.candidate.results if r.status.failed]
    return problems


def _run_smoke(task) -> list[str]:
    """Run make_inputs and the reference (and oracle) on every smoke workload on the CPU."""
    problems = []
    ref = task.reference_module()
    for w in task.spec.smoke_workloads:
        where = f"{task.root / 'reference.py'}: smoke workload {w.id}"
        try:
            args = make_args(ref, task.spec, w, 0, "cpu")
            outs = ref.run(*args)
            container = task.spec.container_problem(type(outs).__name__)
            if container:
                problems.append(f"{where}: run {container}")
            outs = list(outs) if isinstance(outs, (tuple, list)) else [] if outs is None and not task.spec.outputs else [outs]
            if len(outs) != len(task.spec.outputs):
                problems.append(f"{where}: run returned {len(outs)} outputs, task.yaml declares {len(task.spec.outputs)}")
                continue
            for o, spec in zip(outs, task.spec.outputs):
                want = output_shape(spec.shape, w)
                want_dtype = spec.dtype_for(w)
                if not isinstance(o, torch.Tensor) or list(o.shape) != want or o.dtype != torch_dtype(want_dtype):
                    got = f"{type(o).__name__} {list(getattr(o, 'shape', []))} {getattr(o, 'dtype', '')}"
                    problems.append(f"{where}: output {spec.name} is {got}, expected {want} {want_dtype}")
                elif not (st := structure(0, spec, o, w)).passed:  # the declared layout (strides)
                    problems.append(f"{where}: reference output {st.detail}")
            customs = [o.name for o in task.spec.outputs for t in w.checks_for(o.name, o.checks) if t.metric == "custom"]
            if customs and not callable(getattr(ref, "check", None)):
                problems.append(f"{where}: a check is 'custom' but reference.py defines no check()")
            elif customs:  # the reference's own outputs must pass its property check
                named = "output" in inspect.signature(ref.check).parameters
                for name in customs:
                    ok, _err, detail = ref.check(args, outs, **({"output": name} if named else {}))
                    if not ok:
                        problems.append(f"{where}: reference outputs fail check() of {name}: {detail}")
            uses_oracle = any(t.against == "oracle" for o in task.spec.outputs for t in w.checks_for(o.name, o.checks))
            if uses_oracle:
                if not hasattr(ref, "oracle"):
                    problems.append(f"{where}: a check is against 'oracle' but reference.py defines no oracle()")
                else:
                    ref.oracle(*make_args(ref, task.spec, w, 0, "cpu"))
        except Exception as e:  # noqa: BLE001
            problems.append(f"{where}: {type(e).__name__}: {e}")
    return problems


def validate_all(suite_dir: Path = SUITE_DIR, run_smoke: bool = True,
                 run_alternatives: bool = True) -> dict[str, list[str]]:
    """``{task_id: problems}`` for every task folder of the suite."""
    return {t: validate_task(suite_dir / t, run_smoke, run_alternatives) for t in list_tasks(suite_dir)}
