"""Copies of held-back code: a candidate that reproduces a task's own solution is not the agent's.

Agents never see ``solutions/expert.py`` or ``solutions/straightforward.py`` (their sandbox has
no suite); a candidate that reproduces one anyway (a leak from outside the sandbox, a model that
memorised the file) is recorded, marked ``held_back_copy`` and excluded from every score.

Two measures:

* :func:`code_fingerprint`: the syntax tree without docstrings; equal for copies whose
  comments, docstrings and layout alone differ;
* :func:`similarity`: the Jaccard similarity of the two files' sets of :data:`SHINGLE`-token
  windows after renaming every local name to its order of first appearance (attribute names,
  keywords, builtins and literals kept). Renamed variables, moved comments and a few edited
  lines leave it near 1; two independent implementations of one task stay far below
  :data:`COPY_THRESHOLD` (the suite's expert and straightforward solutions of every task:
  ``tests/test_agents_leaks.py`` prints and bounds their similarity).
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import io
import keyword
import tokenize
from pathlib import Path
from typing import Any, cast

#: Tokens per window of :func:`similarity`.
SHINGLE = 8
#: Similarity at or above which a candidate counts as a copy of a held-back file.
COPY_THRESHOLD = 0.8
_KEEP = set(keyword.kwlist) | set(dir(builtins)) | {"self", "cls"}


def code_fingerprint(text: str) -> str:
    """SHA-256 of Python source's syntax tree without docstrings (bare string statements): a copy
    with edited comments, docstrings or layout has the same fingerprint (unparseable text: its
    whitespace-split words)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return hashlib.sha256(" ".join(text.split()).encode()).hexdigest()
    for node in ast.walk(tree):  # bare string statements (docstrings) do nothing: drop them
        body = getattr(node, "body", None)
        if isinstance(body, list):
            kept = [b for b in body if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)
                                            and isinstance(b.value.value, str))]
            cast(Any, node).body = kept or [ast.Pass()]  # a node with a list body (checked above)
    return hashlib.sha256(ast.dump(tree, annotate_fields=False).encode()).hexdigest()


def _docstring_lines(text: str) -> set[int]:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return set()
    lines: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        for b in body if isinstance(body, list) else []:
            if isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str):
                lines.update(range(b.lineno, (b.end_lineno or b.lineno) + 1))
    return lines


def normalized_tokens(text: str) -> list[str]:
    """The token stream of Python source without comments, docstrings and layout, local names
    replaced by their order of first appearance (``_1``, ``_2``, ...)."""
    skip_lines = _docstring_lines(text)
    names: dict[str, str] = {}
    out: list[str] = []
    prev = ""
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return text.split()
    for tok in toks:
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                        tokenize.ENCODING, tokenize.ENDMARKER):
            continue
        if tok.type == tokenize.STRING and tok.start[0] in skip_lines:
            continue
        value = tok.string
        if tok.type == tokenize.NAME and value not in _KEEP and prev != ".":
            value = names.setdefault(value, f"_{len(names) + 1}")
        out.append(value)
        prev = tok.string
    return out


def similarity(a: str, b: str, k: int = SHINGLE) -> float:
    """Jaccard similarity (0..1) of the ``k``-token windows of two sources' normalized tokens."""
    ta, tb = normalized_tokens(a), normalized_tokens(b)
    sa = {tuple(ta[i:i + k]) for i in range(max(1, len(ta) - k + 1))} if ta else set()
    sb = {tuple(tb[i:i + k]) for i in range(max(1, len(tb) - k + 1))} if tb else set()
    if not sa or not sb:
        return 0.0
    return len(sa & sb) / len(sa | sb)


def held_back_copies(task_root: Path, snapshot: Path) -> list[dict]:
    """The task's own solutions (``solutions/*.py``, held back from agents) that the snapshot
    reproduces: ``{"file", "similarity", "identical"}`` for each at or above
    :data:`COPY_THRESHOLD` (``identical``: same :func:`code_fingerprint`)."""
    mine = Path(snapshot).read_text(errors="replace")
    fp = code_fingerprint(mine)
    out = []
    for p in sorted((Path(task_root) / "solutions").glob("*.py")):
        theirs = p.read_text(errors="replace")
        same = code_fingerprint(theirs) == fp
        sim = 1.0 if same else similarity(mine, theirs)
        if sim >= COPY_THRESHOLD:
            out.append({"file": p.name, "similarity": round(sim, 4), "identical": same})
    return out
