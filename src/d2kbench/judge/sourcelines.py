"""Numbered source listings and which of their lines are executable.

The implementation judge sees every judged file as a numbered listing and cites inclusive
line ranges of it; verification reads the same text. A line is *executable* when it holds at
least one token of a statement: comments, blank lines, docstrings and other bare string
statements (no-ops the interpreter evaluates and discards) are not. Classification uses the
standard :mod:`tokenize` (comments, whitespace-only tokens) and :mod:`ast` (string-constant
expression statements), never regular expressions.

Line numbering splits on ``\\n`` only, after CRLF is turned into LF: the same rule as the
tokenizer, so a listing's line ``k`` is the tokenizer's line ``k``.

For evidence that must be *relevant*, each executable line also has a *role*, from the
innermost statement that holds it (:func:`line_roles`): :data:`WORK` (a statement that
computes, launches, loads, stores, branches or loops), or one of the declarative roles that
are never evidence on their own: :data:`IMPORT`, :data:`DECORATOR`, :data:`SIGNATURE` (a
``def`` or ``class`` header), :data:`CONSTANT` (an assignment of a literal value, or an
annotation alone) and :data:`NOOP` (``pass``, ``global``, ``else:``, ``try:``, ..., and
statements that only move a value: ``return out``, ``y = x``, ``x = self.buf``).
:func:`reachable_lines` gives the lines that the entry point ``run`` can reach.
"""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass
from functools import cached_property

#: Kinds of a source line.
CODE, COMMENT, BLANK, DOCSTRING = "code", "comment", "blank", "docstring"
_LAYOUT = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER,
           tokenize.ENCODING}


#: Roles of an executable line (see the module docstring).
WORK, IMPORT, DECORATOR, SIGNATURE, CONSTANT, NOOP = "work", "import", "decorator", "signature", "constant", "no-op"
#: Roles that are never evidence on their own.
DECLARATIVE = frozenset({IMPORT, DECORATOR, SIGNATURE, CONSTANT, NOOP})
#: The function the harness calls: the root of :func:`reachable_lines`.
ENTRY_POINT = "run"


class SourceError(ValueError):
    """A judged file that cannot be parsed as Python (its lines cannot be classified)."""


def normalize_newlines(text: str) -> str:
    """``text`` with CRLF and lone CR line ends turned into LF."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def split_lines(text: str) -> list[str]:
    """The lines of ``text`` as the judge sees them numbered (1-based index = list index + 1)."""
    lines = normalize_newlines(text).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def numbered_listing(text: str, width: int | None = None) -> str:
    """``text`` with a right-aligned line number and a tab before every line (``nl -ba`` style)."""
    lines = split_lines(text)
    w = width or max(4, len(str(len(lines))))
    return "\n".join(f"{i:>{w}}\t{line}" for i, line in enumerate(lines, 1))


def _end(node: ast.stmt | ast.expr) -> tuple[int, int]:
    """``(end_lineno, end_col_offset)`` of a node of a parsed tree (:func:`ast.parse` sets both;
    only a node built by hand lacks them: then its start)."""
    line = node.end_lineno if node.end_lineno is not None else node.lineno
    return line, node.end_col_offset if node.end_col_offset is not None else node.col_offset


def _string_statements(tree: ast.AST, lines: list[str]) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Spans ``((line, col), (end_line, end_col))`` (character columns, as :mod:`tokenize`
    reports them) of expression statements that are a bare string constant: docstrings of
    modules, classes and functions, and stray strings."""

    def chars(line: int, byte_col: int) -> int:  # ast columns are UTF-8 byte offsets
        text = lines[line - 1] if 0 < line <= len(lines) else ""
        return len(text.encode()[:byte_col].decode(errors="ignore"))

    spans = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            end_line, end_col = _end(node)
            spans.append(((node.lineno, chars(node.lineno, node.col_offset)), (end_line, chars(end_line, end_col))))
    return spans


def classify_lines(text: str) -> list[str]:
    """The kind of every line of ``text``: :data:`CODE`, :data:`COMMENT`, :data:`BLANK` or
    :data:`DOCSTRING` (any bare string statement). A line with code and a trailing comment is
    code; a line inside a multi-line string that is part of a statement is code.

    Raises:
        SourceError: the text is not valid Python.
    """
    src = normalize_newlines(text)
    n = len(split_lines(src))
    try:
        tree = ast.parse(src)
        tokens = list(tokenize.generate_tokens(io.StringIO(src).readline))
    except (SyntaxError, tokenize.TokenError, ValueError) as e:
        raise SourceError(f"not valid Python: {e}") from None
    strings = _string_statements(tree, split_lines(src))
    kinds = [BLANK] * (n + 1)  # index 0 unused

    def in_string_statement(start: tuple[int, int]) -> bool:
        return any(a <= start < b for a, b in strings)

    for tok in tokens:
        if tok.type in _LAYOUT:
            if tok.type == tokenize.COMMENT and kinds[tok.start[0]] == BLANK:
                kinds[tok.start[0]] = COMMENT
            continue
        doc = tok.type == tokenize.STRING and in_string_statement(tok.start)
        for ln in range(tok.start[0], min(tok.end[0], n) + 1):
            if doc:
                if kinds[ln] in (BLANK, COMMENT):
                    kinds[ln] = DOCSTRING
            else:
                kinds[ln] = CODE
    return kinds[1:]


def _is_literal(node: ast.AST | None) -> bool:
    if node is None:
        return True  # an annotation without a value
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _is_plain_name(node: ast.AST | None) -> bool:
    """A bare name or a dotted attribute of one (``x``, ``self.buf``, ``torch.float16``)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


def _statement_role(node: ast.stmt) -> str:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return IMPORT
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return SIGNATURE
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and _is_literal(node.value):
        return CONSTANT
    if isinstance(node, (ast.Pass, ast.Global, ast.Nonlocal)):
        return NOOP
    if isinstance(node, ast.Return) and (node.value is None or _is_plain_name(node.value)):
        return NOOP  # returns what was computed elsewhere
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and _is_plain_name(node.value):
        return NOOP  # an alias: moves a value, computes nothing
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return NOOP  # a bare string or number
    return WORK


_BARE_CLAUSES = ("else:", "try:", "finally:")


def line_roles(text: str) -> list[str | None]:
    """The role of every line of ``text`` (index ``k - 1`` is line ``k``): the role of the
    innermost statement that holds it (:data:`WORK` or a declarative role), decorator lines
    :data:`DECORATOR`, clause headers without a condition (``else:``, ``try:``, ``finally:``,
    ``except ...:``) :data:`NOOP`; None for a line outside every statement.

    Raises:
        SourceError: the text is not valid Python.
    """
    src = normalize_newlines(text)
    lines = split_lines(src)
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError) as e:
        raise SourceError(f"not valid Python: {e}") from None
    best: list[tuple[int, str] | None] = [None] * (len(lines) + 1)
    decorators: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            decorators += node.decorator_list
        if not isinstance(node, ast.stmt):
            continue
        end_line = _end(node)[0]
        span, role = end_line - node.lineno, _statement_role(node)
        for ln in range(node.lineno, min(end_line, len(lines)) + 1):
            held = best[ln]
            if held is None or span <= held[0]:
                best[ln] = (span, role)
    roles: list[str | None] = [b[1] if b else None for b in best[1:]]
    for d in decorators:
        for ln in range(d.lineno, min(_end(d)[0], len(lines)) + 1):
            roles[ln - 1] = DECORATOR
    for i, line in enumerate(lines):
        bare = line.split("#", 1)[0].strip()
        if bare in _BARE_CLAUSES or (bare.startswith("except") and bare.endswith(":")):
            roles[i] = NOOP
    return roles


def _bound_names(node: ast.stmt) -> set[str]:
    """Module-level names a top-level statement binds (defs, classes, assignments, imports, and
    those bound inside a module-level ``if``/``try``/``with``)."""
    out: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
            continue
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
        elif isinstance(n, ast.alias):
            out.add((n.asname or n.name).split(".")[0])
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}  # names stored inside a function body are its locals
    return out


def _is_main_guard(node: ast.stmt) -> bool:
    t = node.test if isinstance(node, ast.If) else None
    return (isinstance(t, ast.Compare) and isinstance(t.left, ast.Name) and t.left.id == "__name__"
            and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in t.comparators))


def reachable_lines(text: str, entry: str = ENTRY_POINT) -> set[int] | None:
    """Lines of the top-level statements that the entry point can reach by name: the statement
    that defines ``entry``, every module-level function, class, kernel or binding whose name a
    reachable statement uses (transitively; decorators and defaults included), and
    module-level statements that bind no name (they run at import). Code that ``entry`` never
    names, and an ``if __name__ == "__main__":`` block, is unreachable. Name-based, so it
    over-approximates (a name used only as a local still counts); a function reached only
    through a string (``getattr(module, "f")``) is missed. None when ``text`` defines no
    ``entry`` (nothing is ruled out).

    Raises:
        SourceError: the text is not valid Python.
    """
    try:
        tree = ast.parse(normalize_newlines(text))
    except (SyntaxError, ValueError) as e:
        raise SourceError(f"not valid Python: {e}") from None
    units = [(node, _bound_names(node)) for node in tree.body]
    if not any(entry in bound for _, bound in units):
        return None
    reached = [False] * len(units)
    todo = [i for i, (node, bound) in enumerate(units) if entry in bound or (not bound and not _is_main_guard(node))]
    while todo:
        i = todo.pop()
        if reached[i]:
            continue
        reached[i] = True
        used = {n.id for n in ast.walk(units[i][0]) if isinstance(n, ast.Name)}
        todo += [j for j, (_, bound) in enumerate(units) if not reached[j] and bound & used]
    out: set[int] = set()
    for (node, _), ok in zip(units, reached):
        if ok:
            first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
            out.update(range(first, _end(node)[0] + 1))
    return out


def code_text_lines(text: str) -> list[str]:
    """Every line of ``text`` with its comment (if any) removed, found by :mod:`tokenize`
    (a ``#`` inside a string stays). Index ``k - 1`` is line ``k``.

    Raises:
        SourceError: the text is not valid Python.
    """
    src = normalize_newlines(text)
    lines = split_lines(src)
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(src).readline))
    except (tokenize.TokenError, SyntaxError) as e:
        raise SourceError(f"not valid Python: {e}") from None
    out = list(lines)
    for tok in tokens:
        if tok.type == tokenize.COMMENT and tok.start[0] <= len(out):
            ln, col = tok.start
            out[ln - 1] = out[ln - 1][:col]
    return out


@dataclass(frozen=True)
class SourceFile:
    """One judged file: its name as shown to the judge and its text."""

    name: str
    text: str

    @cached_property
    def lines(self) -> list[str]:
        return split_lines(self.text)

    @cached_property
    def kinds(self) -> list[str]:
        """Line kinds (see :func:`classify_lines`); index ``k - 1`` is line ``k``."""
        return classify_lines(self.text)

    def kind(self, line: int) -> str:
        """The kind of 1-based ``line``."""
        return self.kinds[line - 1]

    @cached_property
    def roles(self) -> list[str | None]:
        """Line roles (see :func:`line_roles`); index ``k - 1`` is line ``k``."""
        return line_roles(self.text)

    @cached_property
    def reachable(self) -> set[int] | None:
        """Lines the entry point reaches (see :func:`reachable_lines`)."""
        return reachable_lines(self.text)

    @cached_property
    def code_lines(self) -> list[str]:
        """Lines without their comments (see :func:`code_text_lines`)."""
        return code_text_lines(self.text)

    def listing(self) -> str:
        return numbered_listing(self.text)
