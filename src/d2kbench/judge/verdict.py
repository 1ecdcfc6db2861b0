"""The judge's output contract: one pydantic model per judge kind, exported as JSON Schema.

The model is asked for exactly this structure (the schema goes to the backend as
``json_schema``) and the answer is validated again here, because providers differ in how
strictly they enforce a schema. Per level (``L1``, ``L2``, ``L3``) the judge gives

* ``evidence``: what it rests the score on (line ranges of the candidate, or exact quotes of
  the design), each naming the rubric property it supports;
* ``realised`` / ``missing``: rubric property ids of the level, every one in exactly one list
  (a partially realised property counts as realised, the rationale says how far);
* ``rationale``: why, naming realised and missing properties;
* ``score``: 0-100, continuous.

Evidence comes first in every level so that a model writing the fields in order collects
evidence before it scores. Limits on evidence (1-4 per nonzero level, minimum quote length,
executable lines, a relevant key-code quote inside each cited range) are *not* part of the
schema: they are checked by
:mod:`d2kbench.judge.evidence`, so that a violation zeroes one level instead of voiding the
whole verdict. The schema stays inside the subset that strict structured-output modes accept
(every property required, no additional properties, no string-length keywords).
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field, ValidationError

LEVELS: tuple[str, ...] = ("L1", "L2", "L3")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CodeCitation(_Strict):
    """An inclusive line range of one judged file, as numbered in the listing the judge saw,
    and the key code in it (verbatim) that realises the property."""

    file: str = Field(description="The judged file's name exactly as shown in its listing header.")
    start_line: int = Field(description="First cited line (1-based, inclusive).")
    end_line: int = Field(description="Last cited line (1-based, inclusive).")
    code: str = Field(description="The key code of the cited lines, copied verbatim without line numbers: the "
                                  "statement(s) that do the work the property names (a computation, launch, load, "
                                  "store, branch or loop), not an import, decorator, constant or signature.")
    supports: str = Field(description="Id of the rubric property of this level that these lines realise.")


class DesignQuote(_Strict):
    """An exact passage of the agent's design."""

    quote: str = Field(description="Text copied verbatim from one field of the design (no ellipses, no edits).")
    supports: str = Field(description="Id of the rubric property of this level that this passage realises.")


_REALISED = "Rubric property ids of this level that are realised, fully or partially."
_MISSING = "Rubric property ids of this level that are not realised."
_RATIONALE = "Why this score: names the realised and the missing properties and what the evidence shows."
_SCORE = "0-100, continuous; 0 when nothing of the level is realised."


class ImplLevel(_Strict):
    """One level of an implementation verdict (evidence first: see the module docstring)."""

    evidence: list[CodeCitation] = Field(description="1-4 citations when the score is above 0; may be empty at 0.")
    realised: list[str] = Field(description=_REALISED)
    missing: list[str] = Field(description=_MISSING)
    rationale: str = Field(description=_RATIONALE)
    score: float = Field(ge=0, le=100, description=_SCORE)


class DesignLevel(_Strict):
    """One level of a design verdict (evidence first: see the module docstring)."""

    evidence: list[DesignQuote] = Field(description="1-4 quotes when the score is above 0; may be empty at 0.")
    realised: list[str] = Field(description=_REALISED)
    missing: list[str] = Field(description=_MISSING)
    rationale: str = Field(description=_RATIONALE)
    score: float = Field(ge=0, le=100, description=_SCORE)


class ImplVerdict(_Strict):
    """The implementation judge's answer."""

    L1: ImplLevel
    L2: ImplLevel
    L3: ImplLevel
    summary: str = Field(description="Two or three sentences on the candidate as a whole.")


class DesignVerdict(_Strict):
    """The design judge's answer."""

    L1: DesignLevel
    L2: DesignLevel
    L3: DesignLevel
    summary: str = Field(description="Two or three sentences on the design as a whole.")


VERDICT_MODELS: dict[str, type[ImplVerdict] | type[DesignVerdict]] = {"impl": ImplVerdict, "design": DesignVerdict}


class MalformedVerdict(ValueError):
    """A judge answer that is not a verdict of the expected shape; ``problems`` name each cause."""

    def __init__(self, kind: str, problems: list[str]):
        self.kind = kind
        self.problems = problems
        super().__init__(f"malformed {kind} verdict: " + "; ".join(problems))


def error_lines(err: ValidationError) -> list[str]:
    """One ``/json/pointer: message`` line per pydantic validation error."""
    out = []
    for e in err.errors():
        loc = "/" + "/".join(str(p) for p in e["loc"]) if e["loc"] else "(top level)"
        out.append(f"{loc}: {e['msg']}")
    return out


def parse_verdict(kind: str, data) -> ImplVerdict | DesignVerdict:
    """Validate a decoded judge answer against the verdict model of ``kind``.

    Args:
        kind: ``impl`` or ``design``.
        data: the decoded JSON answer (a mapping), or its text.

    Returns:
        The verdict.

    Raises:
        MalformedVerdict: not JSON, not an object, or not of the verdict's shape (every
            offending field is named).
    """
    model = VERDICT_MODELS[kind]
    if isinstance(data, (str, bytes)):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as e:
            raise MalformedVerdict(kind, [f"not valid JSON: {e}"]) from None
    if not isinstance(data, dict):
        raise MalformedVerdict(kind, [f"the verdict must be a JSON object, got {type(data).__name__}"])
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise MalformedVerdict(kind, error_lines(e)) from None
