"""The evil-solution suite: known cheats, each of which the harness must reject for the right reason.

Layout (repository root)::

    evil/<task_id>/<name>.py     one cheat per file (files starting with ``_`` are helpers)
    evil/_tasks/<task_id>/       tasks that exist only for the suite (e.g. a graph-timed probe)

Each evil file has a header docstring (catalogue entry, trick, expected outcome) and a
module-level literal ``EXPECT`` dict, read here with :func:`ast.literal_eval` (the parent never
imports an evil file)::

    EXPECT = {
        "status": "integrity_violation",   # the Status the workload must end with
        "rule": "background_thread",       # integrity_violation: a violated rule ("a|b": either); incorrect: part of
                                           # a failed check's name; other statuses: part of the cause
        "catalogue": [2],                  # entries of docs/integrity.md, "The 46 catalogue entries"
        "device": "cpu",                   # "cpu": runs on CPU and GPU; "cuda": GPU only; "cpu_only":
                                           # CPU only (a CPU defence; docs/integrity.md says what the GPU has)
        "static": ["ast_forbidden_import"],  # AST rules the static review must report
        "static_checks": False,            # evaluate without the AST rules (prove the run-time defence)
        "workloads": ["smoke_wide_2x32x96"],  # optional (default: the first smoke workload)
        "evidence": "threading",           # optional: part of the matching violation's evidence
    }
"""

from __future__ import annotations

import ast
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from d2kbench.harness.evaluate import Options, evaluate
from d2kbench.integrity.static import static_violations
from d2kbench.tasks import load_task

#: Default location of the suite: ``<repo>/evil`` (override with ``D2K_EVIL_DIR``).
EVIL_DIR = Path(os.environ.get("D2K_EVIL_DIR", Path(__file__).resolve().parents[3] / "evil"))
_KEYS = {"status", "rule", "catalogue", "device", "static", "static_checks", "workloads", "evidence", "timeout_s"}


@dataclass
class EvilCase:
    """One evil solution and what the harness must say about it."""

    name: str
    task: str
    path: Path
    expect: dict
    doc: str = ""

    @property
    def device(self) -> str:
        return self.expect.get("device", "cpu")


@dataclass
class EvilOutcome:
    """What the harness said about one evil solution, and whether that was the expected verdict."""

    name: str
    task: str
    catalogue: list[int]
    expected_status: str
    expected_rule: str | None
    status: str = ""
    rules: list[str] = field(default_factory=list)
    got_rule: str = ""  # the violated rule, the failed check, or "" (what the "got" column shows)
    evidence: str = ""
    static_expected: list[str] = field(default_factory=list)
    static_found: list[str] = field(default_factory=list)
    static_checks: bool = True
    passed: bool = False
    problem: str = ""
    wall_s: float = 0.0


def read_expect(path: Path) -> tuple[dict, str]:
    """(``EXPECT``, module docstring) of an evil file, parsed without importing it.

    Raises:
        ValueError: no literal ``EXPECT`` dict, or unknown/missing keys.
    """
    tree = ast.parse(Path(path).read_text(), filename=str(path))
    expect = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EXPECT" for t in node.targets):
            expect = ast.literal_eval(node.value)
    if not isinstance(expect, dict):
        raise ValueError(f"{path}: no module-level literal EXPECT dict")
    unknown = set(expect) - _KEYS
    missing = {"status", "catalogue"} - set(expect)
    if unknown or missing:
        raise ValueError(f"{path}: EXPECT has unknown keys {sorted(unknown)} / misses {sorted(missing)}")
    return expect, ast.get_docstring(tree) or ""


def discover(root: Path | None = None, device: str = "cpu") -> list[EvilCase]:
    """Every evil case under ``root`` that runs on ``device`` (``cpu`` cases also run on cuda,
    ``cpu_only`` cases do not)."""
    root = Path(root or EVIL_DIR)
    cases = []
    for task_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))):
        for f in sorted(task_dir.glob("*.py")):
            if f.name.startswith("_"):
                continue
            expect, doc = read_expect(f)
            case = EvilCase(name=f.stem, task=task_dir.name, path=f.resolve(), expect=expect, doc=doc)
            if case.device == "cpu" or case.device == device or (case.device == "cpu_only" and device == "cpu"):
                cases.append(case)
    return cases


def _load_task(task_id: str, root: Path):
    local = root / "_tasks" / task_id
    return load_task(local if (local / "task.yaml").is_file() else task_id)


def run_case(case: EvilCase, device: str, root: Path | None = None, timeout_s: float = 120.0,
             retries: int = 1) -> EvilOutcome:
    """Evaluate one evil solution (no baseline, 3 check calls) and compare with its ``EXPECT``.

    In a working tree that people edit during the run, the parent's file-hash check reports
    their edits as ``harness_tampering``; a case that failed only because of such a change is
    run again (``retries`` times).
    """
    out = _run_case(case, device, root, timeout_s)
    while not out.passed and retries > 0 and _only_external_change(out):
        retries -= 1
        out = _run_case(case, device, root, timeout_s)
    return out


def _only_external_change(out: EvilOutcome) -> bool:
    """The case failed only because the file-hash check saw someone edit the working tree."""
    return out.expected_rule != "harness_tampering" and "harness_tampering" in out.rules and \
        "changed during the evaluation" in out.problem + out.evidence


def _run_case(case: EvilCase, device: str, root: Path | None, timeout_s: float) -> EvilOutcome:
    root = Path(root or EVIL_DIR)
    e = case.expect
    out = EvilOutcome(name=case.name, task=case.task, catalogue=list(e.get("catalogue", [])),
                      expected_status=e["status"], expected_rule=e.get("rule"),
                      static_expected=list(e.get("static", [])), static_checks=bool(e.get("static_checks", True)))
    t0 = time.perf_counter()
    try:
        task = _load_task(case.task, root)
        wl_ids = e.get("workloads") or [task.spec.smoke_workloads[0].id]
        out.static_found = sorted({v.rule for v in static_violations(case.path, task.spec.forbidden.modules)})
        ev = evaluate(task, case.path, [task.spec.workload(w) for w in wl_ids], device, None,
                      options=Options(check_calls=3, timeout_s=float(e.get("timeout_s", timeout_s)),
                                      static_checks=out.static_checks))
    except Exception as exc:  # noqa: BLE001 - a harness crash is a failed case, not a crashed suite
        out.problem = f"harness raised {type(exc).__name__}: {exc}"
        out.wall_s = time.perf_counter() - t0
        return out
    out.wall_s = time.perf_counter() - t0
    results = ev.candidate.results
    bad = [r for r in results if r.status.value != "ok"] or results
    r = bad[0]
    out.status = r.status.value
    out.rules = sorted({v.rule for v in r.violations})
    want = e.get("rule")
    problems = []
    if out.status != e["status"]:
        problems.append(f"status {out.status} (cause: {r.cause[:160]})")
    if want:
        if e["status"] == "integrity_violation":
            wants = want.split("|")  # alternatives: each is a correct detection of the cheat
            match = [v for v in r.violations if v.rule in wants]
            if not match:
                problems.append(f"rule {want!r} not among {out.rules}")
            else:
                out.got_rule = match[0].rule
                out.evidence = match[0].evidence
                if e.get("evidence") and e["evidence"] not in match[0].evidence:
                    problems.append(f"evidence lacks {e['evidence']!r}")
        elif e["status"] == "incorrect":
            failed = [c for c in [*r.checks, *r.integrity_checks] if not c.passed]
            named = [c for c in failed if want in c.name]
            if not named:
                problems.append(f"no failed check named like {want!r} (failed: {[c.name for c in failed][:5]})")
            else:
                check = named[0]
                out.got_rule = check.name
                out.evidence = f"call {check.call}: {check.name}" + (
                    f" error {check.error:.3g} > {check.threshold:.3g}"
                    if check.error is not None and check.threshold is not None else "")
        elif want not in r.cause:
            problems.append(f"cause lacks {want!r}: {r.cause[:160]}")
    if not out.evidence:
        out.evidence = r.cause
    if not out.got_rule and r.violations:
        out.got_rule = r.violations[0].rule
    missing = sorted(set(out.static_expected) - set(out.static_found))
    if missing:
        problems.append(f"static review missed {missing}")
    out.passed = not problems
    out.problem = "; ".join(problems)
    return out


def run_suite(cases: list[EvilCase], device: str, jobs: int = 2, root: Path | None = None,
              progress=None) -> list[EvilOutcome]:
    """Run ``cases`` on ``device`` with ``jobs`` evaluations at a time (each has its own worker)."""
    say = progress or (lambda _m: None)

    def one(case: EvilCase) -> EvilOutcome:
        o = run_case(case, device, root)
        say(f"{'pass' if o.passed else 'FAIL'} {case.task}/{case.name}")
        return o

    if jobs <= 1:
        return [one(c) for c in cases]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, cases))


COLUMNS = ("solution", "catalogue", "expected", "got", "evidence", "static (AST)", "verdict")


def rows(outcomes: list[EvilOutcome]) -> list[dict[str, str]]:
    """Table rows (plain strings) for the CLI and markdown."""
    out = []
    for o in outcomes:
        got_rule = o.got_rule
        out.append({
            "solution": f"{o.task}/{o.name}",
            "catalogue": ",".join(str(c) for c in o.catalogue),
            "expected": f"{o.expected_status}" + (f" / {o.expected_rule}" if o.expected_rule else ""),
            "got": f"{o.status}" + (f" / {got_rule}" if got_rule else ""),
            "evidence": " ".join(o.evidence.split())[:140],
            "static (AST)": ",".join(r.removeprefix("ast_") for r in o.static_found) or "-",
            "verdict": "pass" if o.passed else f"FAIL: {o.problem}",
        })
    return out


def to_markdown(outcomes: list[EvilOutcome], device: str) -> str:
    """The suite's result as a markdown page."""
    n_ok = sum(o.passed for o in outcomes)
    lines = [f"# Evil-solution suite on {device}: {n_ok}/{len(outcomes)} rejected as expected", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows(outcomes):
        lines.append("| " + " | ".join(r[c].replace("|", "/") for c in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def to_json(outcomes: list[EvilOutcome]) -> str:
    """The outcomes as a JSON list."""
    return json.dumps([asdict(o) for o in outcomes], indent=1)
