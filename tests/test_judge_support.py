"""Helpers of the judge tests: verdict builders and the Muon expert's real lines per rubric
property, located with ``ast`` (never hard-coded line numbers, so edits of the expert do not
break the tests)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from d2kbench.tasks import load_task

TASK = "muon_newton_schulz"
GOLDEN = Path(__file__).parent / "golden"
DESIGN_FIXTURE = GOLDEN / "judge_muon_design.json"


def muon():
    return load_task(TASK)


def expert_path() -> Path:
    return muon().root / "solutions" / "expert.py"


def straightforward_path() -> Path:
    return muon().root / "solutions" / "straightforward.py"


def design_fixture() -> dict:
    return json.loads(DESIGN_FIXTURE.read_text())


def level(evidence=(), realised=(), missing=(), score=0.0, rationale="rationale") -> dict:
    """One level of a verdict (as the model would send it)."""
    return {"evidence": list(evidence), "realised": list(realised), "missing": list(missing), "rationale": rationale,
            "score": score}


def first_statement(path: Path, start: int, end: int) -> str:
    """The first line of ``path`` in ``start..end`` that starts a statement, stripped and
    without a trailing comment (the key code a careful judge quotes); "" for an empty range.
    Read as plain text, independent of the verifier."""
    skip = ("#", "@", "def ", "class ", "import ", "from ", '"' * 3, "'" * 3)
    lines = path.read_text().split("\n")
    for line in lines[max(start, 1) - 1:max(end, 0)]:
        text = line.split("  #", 1)[0].strip()
        if text and not text.startswith(skip):
            return text
    return ""


def cite(start: int, end: int, supports: str, file: str = "solution.py", code: str | None = None,
         source: Path | None = None) -> dict:
    """A citation of lines ``start..end``; its key code defaults to the first statement of those
    lines in ``source`` (default: the Muon expert)."""
    if code is None:
        code = first_statement(source or expert_path(), start, end)
    return {"file": file, "start_line": start, "end_line": end, "code": code, "supports": supports}


def quote(text: str, supports: str) -> dict:
    return {"quote": text, "supports": supports}


def verdict(l1: dict, l2: dict, l3: dict, summary: str = "summary") -> dict:
    return {"L1": l1, "L2": l2, "L3": l3, "summary": summary}


def zero_verdict() -> dict:
    """Every property missing, every level 0 (verifies trivially)."""
    return verdict(level(missing=["q_composition", "fixed_restart"]),
                   level(missing=["x_fixed_in_segment", "batched_fused_gemm", "fp32_only_in_norm"]),
                   level(missing=["symmetric_triangle", "tuned_tiles"]))


# ---- the expert's real lines --------------------------------------------------------------------

def _span(node: ast.AST) -> tuple[int, int]:
    return node.lineno, node.end_lineno


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"expert.py has no function {name!r}: the rubric property it shows has moved")


def _find(root: ast.AST, what: str, pred) -> ast.AST:
    for node in ast.walk(root):
        if pred(node):
            return node
    raise AssertionError(f"expert.py: {what} not found")


def _assigns(name: str):
    def pred(node) -> bool:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        return any(isinstance(t, ast.Name) and t.id == name for t in targets)
    return pred


def _calls(node: ast.AST | None, fname: str) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == fname


def expert_property_lines() -> dict[str, list[tuple[int, int]]]:
    """Line ranges of expert.py that realise each rubric property of the Muon task, located by
    code pattern: property id -> [(start, end), ...] (at most 4 per level in total)."""
    tree = ast.parse(expert_path().read_text())
    gns = _function(tree, "_gram_newton_schulz")
    sym_kernel = _function(tree, "_sym_product_kernel")
    out: dict[str, list[tuple[int, int]]] = {}
    # L1: the square state Q is accumulated per step, the Gram is advanced as A <- (P A) P
    q_update = _find(gns, "Q = P if Q is None else ...", lambda n: _assigns("Q")(n) and isinstance(n.value, ast.IfExp))
    a_update = _find(gns, "A <- (P A) P", lambda n: _assigns("A")(n) and _calls(n.value, "_sym_product")
                     and _calls(n.value.args[0], "_sym_product"))
    out["q_composition"] = [_span(q_update), _span(a_update)]
    # L1: two segments split at the restart constant, and the FP16 commit X <- Q X at the restart
    segments = _find(gns, "segments = ((0, RESTART...), ...)", _assigns("segments"))
    restart = _find(gns, "X = _gemm(Q, X, ...)", lambda n: _assigns("X")(n) and _calls(n.value, "_gemm"))
    out["fixed_restart"] = [_span(segments), _span(restart)]
    # L2: rectangular GEMMs only at the segment boundary (final commit or restart commit)
    boundary = _find(gns, "if seg_end == NUM_STEPS", lambda n: isinstance(n, ast.If) and isinstance(n.test, ast.Compare)
                     and isinstance(n.test.left, ast.Name) and n.test.left.id == "seg_end")
    out["x_fixed_in_segment"] = [_span(boundary)]
    # L2: fused epilogue alpha * AB + beta * C + gamma * I, and one launch for the whole batch
    scale = _find(sym_kernel, "acc = acc * alpha", lambda n: _assigns("acc")(n) and isinstance(n.value, ast.BinOp))
    diag = _find(sym_kernel, "if HAS_DIAG", lambda n: isinstance(n, ast.If) and isinstance(n.test, ast.Name)
                 and n.test.id == "HAS_DIAG")
    launch = _find(_function(tree, "_sym_product"), "_sym_product_kernel[grid](...)",
                   lambda n: isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
                   and isinstance(n.value.func, ast.Subscript))
    out["batched_fused_gemm"] = [(scale.lineno, diag.end_lineno), _span(launch)]
    # L2: FP32 only in the normalisation, cast to FP16 in the same kernel
    cast = _find(_function(tree, "_scale_cast_kernel"), "x = (g.to(fp32) / denom).to(fp16)", _assigns("x"))
    out["fp32_only_in_norm"] = [_span(cast)]
    # L3: the mirrored store of off-diagonal tiles, and the upper-triangular tile schedule
    mirror = _find(sym_kernel, "if ti != tj", lambda n: isinstance(n, ast.If) and isinstance(n.test, ast.Compare)
                   and isinstance(n.test.ops[0], ast.NotEq))
    schedule = _find(_function(tree, "_triangle_schedule"), "for r0 in range(...)", lambda n: isinstance(n, ast.For))
    out["symmetric_triangle"] = [_span(mirror), _span(schedule)]
    # L3: the per-shape H200 config table, and the grouped tile order of the rectangular GEMM
    table = _find(tree, "_CONFIG_TABLE", _assigns("_CONFIG_TABLE"))
    gemm = _function(tree, "_gemm_kernel")
    group_first = _find(gemm, "num_pid_in_group = ...", _assigns("num_pid_in_group"))
    group_last = _find(gemm, "pid_n = ...", _assigns("pid_n"))
    out["tuned_tiles"] = [_span(table), (group_first.lineno, group_last.end_lineno)]
    return out


#: Rubric property ids of the Muon task by level.
PROPERTIES = {"L1": ["q_composition", "fixed_restart"],
              "L2": ["x_fixed_in_segment", "batched_fused_gemm", "fp32_only_in_norm"],
              "L3": ["symmetric_triangle", "tuned_tiles"]}
SCORES = {"L1": 90.0, "L2": 85.0, "L3": 80.0}


def expert_verdict(scores: dict[str, float] = SCORES) -> dict:
    """A verdict that credits every rubric property of the expert with its real lines."""
    lines = expert_property_lines()
    levels = {}
    for lvl, props in PROPERTIES.items():
        ev = [cite(a, b, p) for p in props for a, b in lines[p]]
        levels[lvl] = level(ev, realised=props, missing=[], score=scores[lvl],
                            rationale=f"realised: {', '.join(props)}; missing: none")
    return verdict(levels["L1"], levels["L2"], levels["L3"], "Gram-side composition with one restart.")


def text_line(path: Path, needle: str) -> int:
    """The 1-based number of the first line of ``path`` containing ``needle``."""
    for i, line in enumerate(path.read_text().split("\n"), 1):
        if needle in line:
            return i
    raise AssertionError(f"{needle!r} not in {path}")


def test_expert_property_lines_are_within_evidence_limits():
    lines = expert_property_lines()
    assert set(lines) == {p for ps in PROPERTIES.values() for p in ps}
    for props in PROPERTIES.values():
        assert sum(len(lines[p]) for p in props) <= 4
