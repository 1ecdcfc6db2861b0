"""Load task folders (``suite/<task_id>/``) into :class:`Task` objects.

A malformed file raises :class:`TaskFileError`, whose message names the file, the field
(a dotted path such as ``outputs.0.checks.0.max``) and the problem.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from d2kbench.tasks.schema import Alternative, Guidance, Rubric, TaskSpec

#: The pydantic model a YAML file is read into.
M = TypeVar("M", bound=BaseModel)

SUITE_DIR = Path(__file__).resolve().parent.parent / "suite"
#: How a task's alternative is named where a solution is expected (``alt:sdpa_flash``).
ALT_PREFIX = "alt:"
#: The harness file behind ``compile_reference: true`` (``torch.compile`` of the task reference).
COMPILED_REFERENCE = Path(__file__).resolve().parent.parent / "harness" / "compiled_reference.py"

#: Files every task folder must have (docs/tasks.md, "Files").
REQUIRED_FILES = (
    "task.yaml", "reference.py", "template.py", "requirements.md", "guidance.yaml", "rubric.yaml",
)
#: Files staged into an agent's workspace; the rest (expert code, rubric) is held back.
#: ``task.yaml`` is staged as its public rendering (:func:`public_task_yaml`).
SHARED_FILES = ("task.yaml", "reference.py", "template.py", "requirements.md")
#: Parts of ``task.yaml`` an agent never sees: the work models of designs (``sol`` other than
#: the reference's counts: variants, the floor, which solution does which work), the
#: alternatives (harness configuration), the origin (the systems and designs it comes from) and
#: every ``rationale``/``note`` (how tolerances and counts were derived, which names designs).
PRIVATE_SOL_KEYS = ("variants", "floor", "solution_work")
PRIVATE_KEYS = ("alternatives", "origin")
PRIVATE_ANYWHERE = ("rationale", "note")


class TaskFileError(ValueError):
    """A task file is missing or invalid. ``str(err)`` names file, field and problem."""

    def __init__(self, path: Path, problems: list[tuple[str, str]]):
        self.path = Path(path)
        self.problems = problems
        lines = [f"{self.path}: " + (f"{field}: {msg}" if field else msg) for field, msg in problems]
        super().__init__("\n".join(lines))


#: libyaml's safe loader where PyYAML was built with it (the same documents, about 10x faster
#: than the pure-Python one: 0.28 s instead of 2.7 s for the suite's 78 YAML files on the 2-core
#: CI machine; every process that lists the suite reads them), else the pure-Python one.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(text: str):
    """``yaml.safe_load(text)`` through :data:`_SAFE_LOADER`.

    Raises:
        yaml.YAMLError: the text is not valid YAML (the message names line and column).
    """
    return yaml.load(text, Loader=_SAFE_LOADER)  # noqa: S506 - a safe loader (C or Python)


def _read_yaml(path: Path, model: type[M]) -> M:
    if not path.is_file():
        raise TaskFileError(path, [("", "file is missing")])
    try:
        data = safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise TaskFileError(path, [("", f"not valid YAML: {e}")]) from None
    if not isinstance(data, dict):
        raise TaskFileError(path, [("", f"top level must be a mapping, got {type(data).__name__}")])
    try:
        return model.model_validate(data)
    except ValidationError as e:
        problems = [(".".join(str(p) for p in err["loc"]) or "(top level)", err["msg"]) for err in e.errors()]
        raise TaskFileError(path, problems) from None


def import_file(path: Path, name: str | None = None) -> ModuleType:
    """Import a Python file as a fresh module (not cached in ``sys.modules`` under its name).

    Raises:
        Any exception the module raises at import (SyntaxError, ImportError, ...).
    """
    path = Path(path)
    mod_name = name or f"d2k_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:10]}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # needed by triton.jit / dataclasses looking up the module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(mod_name, None)
        raise
    return module


def _strip(node, drop: tuple[str, ...]):
    if isinstance(node, dict):
        return {k: _strip(v, drop) for k, v in node.items() if k not in drop}
    if isinstance(node, list):
        return [_strip(v, drop) for v in node]
    return node


def public_task_yaml(task_root: Path) -> str:
    """The task specification as an agent sees it: ``task.yaml`` without the private parts
    (:data:`PRIVATE_SOL_KEYS`, :data:`PRIVATE_KEYS`, :data:`PRIVATE_ANYWHERE`), so that an
    unguided workspace holds no design notes. The reference's SOL counts stay (what the
    reference computes is public).

    Raises:
        TaskFileError: ``task.yaml`` is missing or not a mapping.
    """
    path = Path(task_root) / "task.yaml"
    if not path.is_file():
        raise TaskFileError(path, [("", "file is missing")])
    data = safe_load(path.read_text())
    if not isinstance(data, dict):
        raise TaskFileError(path, [("", "top level must be a mapping")])
    data = {k: v for k, v in data.items() if k not in PRIVATE_KEYS}
    if isinstance(data.get("sol"), dict):
        data["sol"] = {k: v for k, v in data["sol"].items() if k not in PRIVATE_SOL_KEYS}
    data = _strip(data, PRIVATE_ANYWHERE)
    head = ("# The task specification (its public part: design notes, the work models of designs and the\n"
            "# derivations of tolerances are not included).\n")
    return head + yaml.dump(data, Dumper=_BlockDumper, sort_keys=False, allow_unicode=True, width=100)


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks (``|``), as task files write them."""


_BlockDumper.add_representer(str, lambda d, v: d.represent_scalar("tag:yaml.org,2002:str", v,
                                                                  style="|" if "\n" in v else None))


@dataclass
class Task:
    """A loaded task folder. ``spec`` is the parsed ``task.yaml``."""

    root: Path
    spec: TaskSpec

    @property
    def id(self) -> str:
        return self.spec.id

    @cached_property
    def guidance(self) -> Guidance:
        return _read_yaml(self.root / "guidance.yaml", Guidance)

    @cached_property
    def rubric(self) -> Rubric:
        return _read_yaml(self.root / "rubric.yaml", Rubric)

    def reference_module(self) -> ModuleType:
        return import_file(self.root / "reference.py")

    def solutions(self) -> dict[str, Path]:
        """The task's own solutions by name (``reference`` included)."""
        sols = {"reference": self.root / "reference.py"}
        sol_dir = self.root / "solutions"
        if sol_dir.is_dir():
            sols.update({p.stem: p for p in sorted(sol_dir.glob("*.py")) if not p.name.startswith("_")})
        return sols

    def alternatives(self) -> dict[str, Path]:
        """The task's alternatives (``task.yaml`` ``alternatives``) by solution name
        (``alt:NAME``), each with the file that runs it."""
        return {ALT_PREFIX + a.name: self.alternative_path(a) for a in self.spec.alternatives}

    def alternative_path(self, alt: Alternative) -> Path:
        """The file that runs ``alt``: its own file in the task folder, or the harness's
        :data:`COMPILED_REFERENCE` for ``compile_reference``."""
        return COMPILED_REFERENCE if alt.compile_reference else self.root / str(alt.file)

    def is_trusted(self, path: str | Path) -> bool:
        """Whether ``path`` is trusted code of this task: its ``reference.py`` or the file of one
        of its declared alternatives (compared by resolved path, never by name, so a file placed
        elsewhere is not trusted whatever it is called). Trusted code runs without integrity
        monitors, static rules or the sensitivity call."""
        trusted = {(self.root / "reference.py").resolve(), *(p.resolve() for p in self.alternatives().values())}
        return Path(path).resolve() in trusted

    def solution_sha256(self, path: str | Path) -> str:
        """The identity of a solution of this task in the results store: the sha256 of the file,
        except for the harness-compiled reference, whose hash also covers this task's
        ``reference.py`` (the comparator changes whenever the reference does)."""
        digest = hashlib.sha256(Path(path).read_bytes())
        if Path(path).resolve() == COMPILED_REFERENCE.resolve():
            digest.update((self.root / "reference.py").read_bytes())
        return digest.hexdigest()

    def resolve_solution(self, name_or_path: str | Path, device: str | None = None) -> Path:
        """A solution name of this task (``straightforward``, ``expert``, ``reference``), one of
        its alternatives (``alt:NAME``) or a path.

        Args:
            device: where the solution will run (``cpu`` or ``cuda``); when given, an
                alternative not declared for that device is refused.

        Raises:
            FileNotFoundError: neither a known name nor an existing file (an unknown
                ``alt:NAME`` included).
            ValueError: the alternative does not run on ``device``.
        """
        if str(name_or_path).startswith(ALT_PREFIX):
            return self._resolve_alternative(str(name_or_path)[len(ALT_PREFIX):], device)
        sols = self.solutions()
        if str(name_or_path) in sols:
            return sols[str(name_or_path)]
        p = Path(name_or_path)
        if p.is_file():
            return p.resolve()
        raise FileNotFoundError(
            f"{name_or_path!r} is neither a solution of task {self.id!r} ({', '.join([*sols, *self.alternatives()])}) "
            "nor a file"
        )

    def _resolve_alternative(self, name: str, device: str | None) -> Path:
        try:
            alt = self.spec.alternative(name)
        except KeyError as e:
            raise FileNotFoundError(e.args[0]) from None
        if device is not None and device not in alt.devices:
            raise ValueError(f"alternative {ALT_PREFIX}{name} of task {self.id!r} runs on {', '.join(alt.devices)} "
                             f"only, not on {device}")
        return self.alternative_path(alt)


def load_task(task: str | Path) -> Task:
    """Load a task by id (a folder under the suite) or by folder path.

    Raises:
        TaskFileError: the folder or ``task.yaml`` is missing or invalid.
    """
    root = Path(task)
    if not root.is_dir():
        root = SUITE_DIR / str(task)
    if not root.is_dir():
        known = ", ".join(t for t in list_tasks()) or "none"
        raise TaskFileError(Path(task), [("", f"no such task (known: {known})")])
    spec = _read_yaml(root / "task.yaml", TaskSpec)
    if spec.id != root.name:
        raise TaskFileError(root / "task.yaml", [("id", f"{spec.id!r} differs from the folder name {root.name!r}")])
    missing = [(f"alternatives.{i}.file", f"{a.file} does not exist in {root}")
               for i, a in enumerate(spec.alternatives) if a.file and not (root / a.file).is_file()]
    if missing:
        raise TaskFileError(root / "task.yaml", missing)
    return Task(root=root.resolve(), spec=spec)


def list_tasks(suite_dir: Path = SUITE_DIR) -> list[str]:
    """Ids of the task folders in the suite (folders that hold a ``task.yaml``)."""
    return sorted(p.parent.name for p in Path(suite_dir).glob("*/task.yaml"))
