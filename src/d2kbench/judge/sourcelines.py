"""Numbered source listings and which of their lines are executable.

The implementation judge sees every judged file as a numbered listing and cites inclusive
line ranges of it; verification reads the same text. A line is *executable* when it holds at
least one token of a statement: comments, blank lines, docstrings and other bare string
statements (no-ops the interpreter evaluates and discards) are not. Classification uses the
standard :mod:`tokenize` (comments, whitespace-only tokens) and :mod:`ast` (string-constant
expression statements), never regular expressions.

Line numbering splits on ``\\n`` only, after CRLF is turned into LF: the same rule as the
tokenizer, so a listing's line ``k`` is the tokenizer's line ``k``.
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
            spans.append(((node.lineno, chars(node.lineno, node.col_offset)),
                          (node.end_lineno, chars(node.end_lineno, node.end_col_offset))))
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

    def listing(self) -> str:
        return numbered_listing(self.text)
