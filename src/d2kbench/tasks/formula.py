"""Safe evaluation of work formulas written in task files (``"2 * B * M**2 * N"``).

Only numbers, axis names, ``+ - * / // ** %``, parentheses and ``min``/``max``/``ceil``
are allowed; anything else raises :class:`FormulaError` naming the offending piece.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping

_BINOPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow,
    ast.Mod: operator.mod,
}
_FUNCS: dict[str, Callable[..., float]] = {"min": min, "max": max, "ceil": math.ceil}


class FormulaError(ValueError):
    """A formula that is not plain arithmetic over known names."""


def _parse(expr: str) -> ast.Expression:
    try:
        tree = ast.parse(str(expr), mode="eval")
    except SyntaxError as e:
        raise FormulaError(f"cannot parse formula {expr!r}: {e.msg}") from None
    for node in ast.walk(tree):
        ok = isinstance(
            node,
            (ast.Expression, ast.BinOp, ast.UnaryOp, ast.USub, ast.UAdd, ast.Constant, ast.Name,
             ast.Call, ast.Load, *_BINOPS),
        )
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float)):
            ok = False
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in _FUNCS):
            ok = False
        if not ok:
            raise FormulaError(f"formula {expr!r} contains a forbidden element: {ast.dump(node)[:60]}")
    return tree


def formula_names(expr: str) -> set[str]:
    """The free names a formula uses (function names excluded)."""
    tree = _parse(expr)
    calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - calls


def evaluate_formula(expr: str, values: Mapping[str, int | float]) -> float:
    """Evaluate ``expr`` with axis values.

    Raises:
        FormulaError: on a forbidden construct or an unknown name.
    """

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant):
            return node.value  # type: ignore[return-value]  # _parse admits numeric constants only
        if isinstance(node, ast.Name):
            if node.id not in values:
                raise FormulaError(f"formula {expr!r} uses unknown name {node.id!r}")
            return values[node.id]
        if isinstance(node, ast.UnaryOp):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp):
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):  # _parse admits no other calls
            return _FUNCS[node.func.id](*[ev(a) for a in node.args])
        raise FormulaError(f"unsupported element in {expr!r}")

    return float(ev(_parse(expr)))
