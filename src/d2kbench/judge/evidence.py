"""Mechanical verification of a verdict's evidence (docs/protocol.md, "Judge").

Every rule is deterministic and implemented here; a level whose evidence breaks any rule
scores 0. The rules, per level:

Common
  * The level's ``realised`` and ``missing`` lists name rubric property ids of that level
    only, and every property of the level appears in exactly one of them.
  * A score above 0 needs at least one realised property and 1 to :data:`MAX_EVIDENCE`
    evidence items; duplicates are not allowed. (A score of 0 needs no evidence; any it
    gives is ignored.)
  * Every evidence item ``supports`` a property listed as realised, and every realised
    property is supported by at least one evidence item. (Rubric levels therefore hold at
    most :data:`MAX_EVIDENCE` properties.)

Code citations (implementation judge)
  * ``file`` is one of the judged files; ``1 <= start_line <= end_line <= number of lines``;
    a range spans at most :data:`MAX_SPAN` lines.
  * **Policy on non-executable lines**: a range must start *and* end on an executable line,
    must not touch a docstring (or any other bare string statement), and at least half of its
    lines must be executable; comment and blank lines are tolerated only strictly inside a
    range. So a citation of a comment, a docstring or a blank line always fails, and a range
    cannot be padded with commentary to look like code.
  * **Relevance** (evidence that proves something): every citation quotes its key code
    (``code``, at least :data:`MIN_CODE_CHARS` characters besides whitespace), and

    - the quote sits inside the cited range: it is found in the range's code (comments
      removed) with whitespace ignored, possibly across lines, and not elsewhere only;
    - the lines it covers hold *work* (:data:`d2kbench.judge.sourcelines.WORK`): imports,
      decorators, ``def``/``class`` signatures, constants (an assignment of a literal value)
      and no-ops (``pass``, ``return out``, an alias ``y = x``) alone are not evidence,
      wherever they sit;
    - that work is reachable from the entry point ``run``: code that ``run`` never calls,
      launches or reads (a dead "optimised" helper next to a naive path) proves nothing about
      what runs (:func:`d2kbench.judge.sourcelines.reachable_lines`).

Design quotes (design judge)
  * Both sides are normalised identically and minimally: Unicode NFC, line ends to LF, every
    run of whitespace to one space, surrounding whitespace and quotation marks stripped. No
    case folding, no punctuation changes, no fuzzy matching.
  * A quote has at least :data:`MIN_QUOTE_CHARS` characters after normalisation and is an
    exact substring of *one* text field of the agent's design (see
    :func:`d2kbench.judge.design_schema.design_leaves`).
  * A quote that is not in the design fails, and when it occurs in the guidance or the
    rubric the failure says so (the judge quoted the criteria, not the design).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field

from d2kbench.judge.sourcelines import BLANK, CODE, COMMENT, DECLARATIVE, DOCSTRING, SourceError, SourceFile
from d2kbench.judge.verdict import CodeCitation, DesignLevel, DesignQuote, ImplLevel

#: Version of the verification rules; part of the judge cache key.
VERIFIER_VERSION = "3"
#: Most evidence items per level.
MAX_EVIDENCE = 4
#: Shortest design quote, in characters after normalisation.
MIN_QUOTE_CHARS = 12
#: Longest cited line range, in lines.
MAX_SPAN = 40
#: Least share of executable lines in a cited range.
MIN_EXECUTABLE_SHARE = 0.5
#: Shortest key-code quote of a citation, in characters other than whitespace.
MIN_CODE_CHARS = 8

_WS = re.compile(r"\s+")
_QUOTE_MARKS = "\"'`\u201c\u201d\u2018\u2019\u00ab\u00bb"


def normalize_text(text: str) -> str:
    """Unicode NFC, CRLF/CR to LF, whitespace runs collapsed to one space, ends stripped."""
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    return _WS.sub(" ", text).strip()


def normalize_quote(quote: str) -> str:
    """A quote normalised like the design text, with surrounding quotation marks removed."""
    q = normalize_text(quote)
    while len(q) >= 2 and q[0] in _QUOTE_MARKS and q[-1] in _QUOTE_MARKS:
        q = q[1:-1].strip()
    return q


@dataclass
class LevelCheck:
    """The verification of one level: ``errors`` is empty when the level verified."""

    level: str
    errors: list[str] = field(default_factory=list)
    #: per evidence item: where it was found (``lines 12-20 of solution.py`` / a JSON pointer)
    located: list[str | None] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def _common(level: str, verdict: ImplLevel | DesignLevel, properties: list[str], check: LevelCheck) -> None:
    props = set(properties)
    for name in ("realised", "missing"):
        unknown = [p for p in getattr(verdict, name) if p not in props]
        if unknown:
            check.errors.append(f"{level}: {name} names {', '.join(map(repr, unknown))}, not a property of {level} "
                                f"(properties: {', '.join(properties)})")
    both = sorted(set(verdict.realised) & set(verdict.missing))
    if both:
        check.errors.append(f"{level}: {', '.join(both)} listed both as realised and as missing")
    unlisted = [p for p in properties if p not in verdict.realised and p not in verdict.missing]
    if unlisted:
        check.errors.append(f"{level}: properties neither realised nor missing: {', '.join(unlisted)}")
    if verdict.score <= 0:
        return
    n = len(verdict.evidence)
    if n == 0:
        check.errors.append(f"{level}: score {verdict.score:g} without evidence (1-{MAX_EVIDENCE} items needed)")
    elif n > MAX_EVIDENCE:
        check.errors.append(f"{level}: {n} evidence items, at most {MAX_EVIDENCE} are allowed")
    if not verdict.realised:
        check.errors.append(f"{level}: score {verdict.score:g} but no property listed as realised")
    evidence: Sequence[CodeCitation | DesignQuote] = verdict.evidence
    seen: list[str] = []
    for i, ev in enumerate(evidence, 1):
        key = ev.model_dump_json()
        if key in seen:
            check.errors.append(f"{level} evidence {i}: repeats evidence {seen.index(key) + 1}")
        seen.append(key)
        if ev.supports not in verdict.realised:
            check.errors.append(f"{level} evidence {i}: supports {ev.supports!r}, which is not listed as realised")
    unsupported = [p for p in verdict.realised if p in props and not any(e.supports == p for e in evidence)]
    if unsupported:
        check.errors.append(f"{level}: realised properties without evidence: {', '.join(unsupported)}")


# ---- code citations -------------------------------------------------------------------------------

def check_citation(c: CodeCitation, files: dict[str, SourceFile]) -> str | None:
    """Why citation ``c`` fails, or None when it verifies (rules in the module docstring)."""
    f = files.get(c.file)
    if f is None:
        return f"file {c.file!r} is not a judged file (judged: {', '.join(files)})"
    n = len(f.lines)
    rng = f"lines {c.start_line}-{c.end_line} of {c.file}"
    if not (1 <= c.start_line <= c.end_line <= n):
        return f"{rng}: not a valid inclusive range inside the file's {n} lines"
    if c.end_line - c.start_line + 1 > MAX_SPAN:
        return f"{rng}: spans {c.end_line - c.start_line + 1} lines, at most {MAX_SPAN} are allowed"
    try:
        kinds = [f.kind(k) for k in range(c.start_line, c.end_line + 1)]
    except SourceError as e:
        return f"{c.file}: {e}"
    what = {COMMENT: "a comment", BLANK: "blank", DOCSTRING: "a docstring"}
    if kinds[0] != CODE:
        return f"{rng}: line {c.start_line} is {what[kinds[0]]}, not executable code"
    if kinds[-1] != CODE:
        return f"{rng}: line {c.end_line} is {what[kinds[-1]]}, not executable code"
    if DOCSTRING in kinds:
        k = c.start_line + kinds.index(DOCSTRING)
        return f"{rng}: line {k} is a docstring; cite code only"
    share = kinds.count(CODE) / len(kinds)
    if share < MIN_EXECUTABLE_SHARE:
        return f"{rng}: only {kinds.count(CODE)} of {len(kinds)} lines are executable"
    return check_key_code(c, f, rng)


_LINE_NUMBER = re.compile(r"^\s*\d+\t", re.M)


def _squeeze(text: str) -> str:
    return "".join(text.split())


def located_code(c: CodeCitation, f: SourceFile) -> list[int] | None:
    """The lines of ``c``'s range that its key-code quote covers (whitespace ignored, comments
    removed, across lines), or None when the quote is not inside the range."""
    quote = _squeeze(_LINE_NUMBER.sub("", unicodedata.normalize("NFC", c.code)))
    if not quote:
        return None
    text, owner = "", []
    for k in range(c.start_line, c.end_line + 1):
        if f.kind(k) != CODE:
            continue
        part = _squeeze(unicodedata.normalize("NFC", f.code_lines[k - 1]))
        text += part
        owner += [k] * len(part)
    at = text.find(quote)
    if at < 0:
        return None
    return sorted(set(owner[at:at + len(quote)]))


def check_key_code(c: CodeCitation, f: SourceFile, rng: str) -> str | None:
    """Why the key code of citation ``c`` (of file ``f``) is not relevant evidence, or None
    (rules in the module docstring, "Relevance")."""
    quote = _squeeze(c.code)
    if len(quote) < MIN_CODE_CHARS:
        return (f"{rng}: the key code {c.code.strip()!r} has {len(quote)} characters besides whitespace, at least "
                f"{MIN_CODE_CHARS} are needed (quote the statement that does the work)")
    covered = located_code(c, f)
    if covered is None:
        where = ""
        whole = located_code(c.model_copy(update={"start_line": 1, "end_line": len(f.lines)}), f)
        if whole:
            where = f" (it is at line {whole[0]}: cite that line)"
        return f"{rng}: the key code {_short(c.code.strip())} is not inside the cited lines{where}"
    work = [k for k in covered if f.roles[k - 1] not in DECLARATIVE and f.roles[k - 1] is not None]
    if not work:
        roles = sorted({f.roles[k - 1] or "no statement" for k in covered})
        return (f"{rng}: the key code is only {' and '.join(roles)} "
                "lines; imports, decorators, signatures, constants and no-ops (a bare return, an alias) are not "
                "evidence: cite the code that does the work")
    reach = f.reachable
    if reach is not None and not any(k in reach for k in work):
        return (f"{rng}: the key code is in code that run() never reaches (not called, launched or read from "
                "run): it shows nothing about what runs")
    return None


def verify_impl_level(level: str, verdict: ImplLevel, properties: list[str],
                      files: dict[str, SourceFile]) -> LevelCheck:
    """Verify one level of an implementation verdict against the judged files.

    Args:
        level: ``L1``, ``L2`` or ``L3``.
        verdict: the judge's answer for the level.
        properties: the rubric property ids of the level.
        files: the judged files by the name shown to the judge.
    """
    check = LevelCheck(level)
    _common(level, verdict, properties, check)
    if verdict.score <= 0:
        return check
    for i, c in enumerate(verdict.evidence, 1):
        why = check_citation(c, files)
        check.located.append(None if why else f"lines {c.start_line}-{c.end_line} of {c.file}")
        if why:
            check.errors.append(f"{level} evidence {i}: {why}")
    return check


# ---- design quotes --------------------------------------------------------------------------------

def locate_quote(quote: str, leaves: dict[str, str]) -> str | None:
    """The JSON pointer of the first design field that contains ``quote`` (normalised), or None."""
    q = normalize_quote(quote)
    if not q:
        return None
    for ptr, text in leaves.items():
        if q in normalize_text(text):
            return ptr
    return None


def check_quote(q: DesignQuote, leaves: dict[str, str], criteria: dict[str, str]) -> tuple[str | None, str | None]:
    """``(why it fails or None, JSON pointer where found or None)`` for one design quote.

    Args:
        q: the quote.
        leaves: the design's text fields by JSON pointer.
        criteria: texts the judge saw or knows that are *not* the design (guidance, rubric),
            by name; a quote found only there is reported as taken from them.
    """
    text = normalize_quote(q.quote)
    if len(text) < MIN_QUOTE_CHARS:
        return f"quote {text!r} has {len(text)} characters, at least {MIN_QUOTE_CHARS} are needed", None
    ptr = locate_quote(text, leaves)
    if ptr is not None:
        return None, ptr
    sources = [name for name, t in criteria.items() if text in normalize_text(t)]
    if sources:
        return f"quote {_short(text)} is taken from the {' and the '.join(sources)}, not from the design", None
    splice = " (it looks spliced: quote one passage without ellipses)" if ("..." in text or "\u2026" in text) else ""
    return f"quote {_short(text)} is not found verbatim in any field of the design{splice}", None


def _short(text: str, n: int = 70) -> str:
    return repr(text if len(text) <= n else text[: n - 3] + "...")


def verify_design_level(level: str, verdict: DesignLevel, properties: list[str], leaves: dict[str, str],
                        criteria: dict[str, str]) -> LevelCheck:
    """Verify one level of a design verdict against the design's text fields.

    Args:
        level: ``L1``, ``L2`` or ``L3``.
        verdict: the judge's answer for the level.
        properties: the rubric property ids of the level.
        leaves: the design's text fields by JSON pointer.
        criteria: guidance and rubric texts by name (see :func:`check_quote`).
    """
    check = LevelCheck(level)
    _common(level, verdict, properties, check)
    if verdict.score <= 0:
        return check
    for i, q in enumerate(verdict.evidence, 1):
        why, ptr = check_quote(q, leaves, criteria)
        check.located.append(ptr)
        if why:
            check.errors.append(f"{level} evidence {i}: {why}")
    return check
