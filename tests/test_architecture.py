"""The package structure of docs/architecture.md holds: packages import only packages below them,
there are no import circles (imports inside functions included), and the text of the repository
cites only files in the repository.

The import graph is read from the source with ``ast`` (nothing is imported), so an import hidden
inside a function counts like any other.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "d2kbench"

#: Floors of docs/architecture.md, bottom (0) to top. A module may import modules of its own
#: package or of a lower floor. ``d2kbench`` is the package's ``__init__`` (its version).
FLOORS = {
    "d2kbench": 0, "tasks": 0, "results": 0, "phases": 0, "terminal": 0, "machine": 0,
    "scoring": 1, "store": 1, "sandbox": 1,
    "checking": 2,
    "integrity": 3,
    "harness": 4,
    "agents": 5,
    "campaign": 6, "judge": 6,
    "report": 7,
}


def is_cli(module: str) -> bool:
    """The CLI layer: ``d2kbench.cli`` and each package's ``commands`` module (the top floor)."""
    return module == "d2kbench.cli" or module.endswith(".commands")


def package_of(module: str) -> str:
    """``d2kbench.harness.worker`` -> ``harness``; ``d2kbench.results`` -> ``results``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def modules() -> dict[str, Path]:
    """Every module of the package outside the task folders (tasks are loaded by path)."""
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        if "suite" in rel.parts:
            continue
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The ``d2kbench`` modules ``module`` imports anywhere in its source (``if TYPE_CHECKING``
    blocks excluded: they never run)."""
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            targets = [f"{stem}.{a.name}" for a in node.names]
        else:
            for child in ast.iter_child_nodes(node):
                visit(child)
            return
        for t in targets:
            if t.split(".")[0] == "d2kbench" and ".suite" not in t:
                hit = resolve(t)
                if hit and hit != module:
                    found.add(hit)

    visit(tree)
    return found


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imports_of(m, p, set(mods)) for m, p in mods.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Packages and the packages they import, the CLI layer left out (it is the top floor)."""
    out: dict[str, set[str]] = {}
    for m, targets in graph.items():
        if is_cli(m):
            continue
        out.setdefault(package_of(m), set()).update(
            package_of(t) for t in targets if package_of(t) != package_of(m))
    return out


def test_the_circle_finder_finds_circles():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_the_import_reader_sees_imports_inside_functions(tmp_path):
    src = tmp_path / "mod.py"
    src.write_text("def f():\n    from d2kbench.harness import evaluate\n"
                   "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import d2kbench.report\n")
    found = imports_of("d2kbench.scoring.mod", src, {"d2kbench.harness.evaluate", "d2kbench.report"})
    assert found == {"d2kbench.harness.evaluate"}


def test_no_import_circles_between_modules():
    assert circles(import_graph()) == []


def test_no_import_circles_between_packages():
    assert circles(package_graph(import_graph())) == []


def test_every_package_has_a_floor():
    packages = {package_of(m) for m in modules() if not is_cli(m)}
    assert packages <= set(FLOORS), f"packages without a floor in docs/architecture.md: {packages - set(FLOORS)}"


def test_packages_import_only_downwards():
    graph = import_graph()
    up = sorted(f"{m} -> {t}" for m, targets in graph.items() if not is_cli(m) for t in targets
                if is_cli(t) or FLOORS[package_of(t)] > FLOORS[package_of(m)]
                or (FLOORS[package_of(t)] == FLOORS[package_of(m)] and package_of(t) != package_of(m)
                    and FLOORS[package_of(m)] > 0))
    assert up == [], "imports that run up (or sideways between packages of one floor):\n" + "\n".join(up)


def test_the_ground_floor_imports_nothing_above_it():
    graph = import_graph()
    ground = [m for m in graph if FLOORS.get(package_of(m)) == 0 and not is_cli(m)]
    assert "d2kbench.results" in ground and "d2kbench.tasks.schema" in ground
    bad = sorted(f"{m} -> {t}" for m in ground for t in graph[m] if FLOORS.get(package_of(t), 99) > 0)
    assert bad == []


#: Documents that are not in this repository, and issue numbers instead of subjects.
OUTSIDE = re.compile(r"\b(SPEC|DESIGN|TASKS|KINDS)\.md\b|timing_and_sol\.md|\.\./shared/|shared/research/"
                     r"|\b[Ii]ssue #?\d+\b")


@pytest.mark.parametrize("folder", ["src", "tests", "devtools", "docs", "evil", "tools", "README.md"])
def test_text_cites_only_files_of_this_repository(folder):
    bad = []
    top = ROOT / folder
    for path in sorted(top.rglob("*")) if top.is_dir() else [top]:
        if path.suffix not in (".py", ".md", ".yaml", ".sh") or path == Path(__file__).resolve():
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert bad == []


def test_docs_cited_by_docstrings_exist():
    cited = set()
    for path in PKG.rglob("*.py"):
        cited |= set(re.findall(r"\bdocs/[\w-]+\.md\b", path.read_text()))
    assert cited, "the pattern finds the citations"
    assert sorted(c for c in cited if not (ROOT / c).is_file()) == []


def _imports_inside_functions(tree: ast.AST) -> list[ast.stmt]:
    found: list[ast.stmt] = []

    def walk(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)) and inside:
                found.append(child)
            walk(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    walk(tree, False)
    return found


def test_imports_inside_functions_say_why():
    """A module that imports inside functions says why (start-up time, an optional extra, the
    worker's order), once for the module or on the import's line."""
    silent = []
    for module, path in modules().items():
        src = path.read_text()
        lines = src.splitlines()
        late = [n for n in _imports_inside_functions(ast.parse(src)) if "#" not in lines[n.lineno - 1]]
        if late and "# Imports inside functions: " not in src:
            silent.append(f"{module}:{late[0].lineno}")
    assert silent == []


def test_the_late_import_finder_sees_nested_imports():
    tree = ast.parse("import os\ndef f():\n    if True:\n        import json\nclass C:\n    def m(self):\n        import re\n")
    assert [n.names[0].name for n in _imports_inside_functions(tree)] == ["json", "re"]
