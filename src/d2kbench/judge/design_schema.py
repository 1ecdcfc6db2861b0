"""``model_design.json``: what an independent design run submits (docs/protocol.md, "Runs").

The agent sees only the shared task files and must propose a design in three levels, each
entry a *causal chain* from a bottleneck at the registered shapes, through a change, to the
cost it removes, with the conditions under which it holds and what distinguishes full from
partial adoption; a dataflow graph (stages and edges with outputs, layout, ownership,
residency, lifetime and readiness); and L3 mechanisms tied to the L1/L2 benefit they serve,
with pitfalls and what must be measured.

:class:`ModelDesign` is the single source of truth: the published JSON Schema
(``judge/schemas/model_design.schema.json``) and the ``submit_design`` tool's parameters are
exported from it, and :func:`validate_design` checks a submission with it, including the
cross-references a JSON Schema cannot express (ids unique, references resolve).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

#: Version of the design schema; a submission states it in ``schema_version``.
SCHEMA_VERSION = "1"
#: The largest accepted design, in characters of compact JSON (long designs do not earn more).
MAX_DESIGN_CHARS = 60_000

Id = Annotated[str, StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")]
Text = Annotated[str, StringConstraints(min_length=1, max_length=4000)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CausalChain(_Strict):
    """Bottleneck at the registered shapes -> change -> cost reduction."""

    bottleneck: Text = Field(description=(
        "The cost this entry attacks at the registered workload shapes: which computation or memory traffic, "
        "how large (FLOPs or bytes per call at a named shape), and why it limits performance there."))
    change: Text = Field(description="What is done differently from the reference's direct computation.")
    cost_reduction: Text = Field(description=(
        "Which work or traffic disappears or shrinks, with an estimate at the registered shapes."))


class Adoption(_Strict):
    """What an implementation shows when it adopts this entry fully, and when only partly."""

    full: Text = Field(description="What an implementation must visibly do to count as full adoption.")
    partial: Text = Field(description="What a partial or superficial adoption looks like, and what it misses.")


class L1Entry(_Strict):
    """An algorithmic transformation."""

    id: Id
    title: Text
    causal_chain: CausalChain
    correctness: Text = Field(description="Why the transformation preserves the required semantics and tolerance.")
    conditions: list[Text] = Field(min_length=1, description=(
        "When the transformation applies and when it does not (shapes, aspect ratios, precision)."))
    adoption_evidence: Adoption


class L2Entry(_Strict):
    """A dataflow decision: placement, layout, ownership, lifetimes, reuse, parallelism."""

    id: Id
    title: Text
    builds_on: list[Id] = Field(description="Ids of the L1 entries this dataflow realises (may be empty).")
    causal_chain: CausalChain
    placement: Text = Field(description="Where each value lives: registers, shared memory, L2, HBM.")
    layout: Text = Field(description="Layouts and dtypes of the values involved.")
    ownership: Text = Field(description="Which kernel, program or tile produces and owns each value.")
    lifetimes: Text = Field(description="How long each value persists and when it is discarded.")
    reuse: Text = Field(description="Which intermediates are reused, recomputed or never materialised.")
    parallelism: Text = Field(description="What runs in parallel and what is sequential at the registered shapes.")
    conditions: list[Text] = Field(min_length=1, description="When this dataflow is the right one.")
    adoption_evidence: Adoption


class L3Entry(_Strict):
    """A low-level mechanism on the target GPU, tied to the L1/L2 benefit it serves."""

    id: Id
    mechanism: Text = Field(description="The mechanism (tiling, pipelining, symmetry, synchronisation, layout...).")
    serves: list[Id] = Field(min_length=1, description="Ids of the L1/L2 entries whose benefit it preserves.")
    benefit: Text = Field(description="How the mechanism realises or preserves that benefit on the target GPU.")
    pitfalls: list[Text] = Field(min_length=1, description="What goes wrong when it is done carelessly.")
    measure: list[Text] = Field(min_length=1, description=(
        "What must be measured to confirm it works (per kernel, at named shapes)."))
    adoption_evidence: Adoption


class DataflowStage(_Strict):
    """One stage of the dataflow (typically one kernel or one phase of a kernel)."""

    id: Id
    operation: Text = Field(description="What the stage computes.")
    outputs: list[Text] = Field(min_length=1, description="The values it produces (name, shape, dtype).")
    layout: Text = Field(description="Layout of its outputs.")
    ownership: Text = Field(description="Which programs or tiles write which part of the outputs.")
    residency: Text = Field(description="Where the outputs live (registers, shared memory, L2, HBM).")
    lifetime: Text = Field(description="Until when the outputs are kept.")
    readiness: Text = Field(description="When the outputs are ready for consumers (kernel boundary, barrier...).")


class DataflowEdge(_Strict):
    """A value passed from one stage to another."""

    source: Id = Field(description="Id of the producing stage.")
    target: Id = Field(description="Id of the consuming stage.")
    value: Text = Field(description="The value carried.")
    layout: Text
    ownership: Text = Field(description="Who owns the value while it is in flight.")
    residency: Text
    lifetime: Text = Field(description="How long the consumer needs the value.")
    readiness: Text = Field(description="What guarantees the value is complete before it is read.")


class Dataflow(_Strict):
    """Stages and the edges between them."""

    stages: list[DataflowStage] = Field(min_length=1)
    edges: list[DataflowEdge]


class ModelDesign(_Strict):
    """``model_design.json``: an independently proposed design (no code)."""

    schema_version: Literal["1"] = Field(description="Always \"1\".")
    task: Id = Field(description="The task id.")
    summary: Text = Field(description="The design in a few sentences.")
    L1: list[L1Entry] = Field(min_length=1, description="Algorithmic insight.")
    L2: list[L2Entry] = Field(min_length=1, description="Dataflow.")
    L3: list[L3Entry] = Field(min_length=1, description="Low-level mechanisms on the target GPU.")
    dataflow: Dataflow

    @model_validator(mode="after")
    def _references(self) -> ModelDesign:
        problems = []
        entries: list[L1Entry | L2Entry | L3Entry] = [*self.L1, *self.L2, *self.L3]
        ids = [e.id for e in entries]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            problems.append(f"entry ids must be unique across L1, L2 and L3 (repeated: {', '.join(dup)})")
        l1, l12 = {e.id for e in self.L1}, {e.id for e in entries[:len(self.L1) + len(self.L2)]}
        for k, e in enumerate(self.L2):
            for ref in e.builds_on:
                if ref not in l1:
                    problems.append(f"/L2/{k}/builds_on: {ref!r} is not the id of an L1 entry")
        for k, entry in enumerate(self.L3):
            for ref in entry.serves:
                if ref not in l12:
                    problems.append(f"/L3/{k}/serves: {ref!r} is not the id of an L1 or L2 entry")
        stages = [s.id for s in self.dataflow.stages]
        dup = sorted({i for i in stages if stages.count(i) > 1})
        if dup:
            problems.append(f"/dataflow/stages: stage ids must be unique (repeated: {', '.join(dup)})")
        for k, edge in enumerate(self.dataflow.edges):
            for end in ("source", "target"):
                if getattr(edge, end) not in stages:
                    problems.append(f"/dataflow/edges/{k}/{end}: {getattr(edge, end)!r} is not a stage id")
        if problems:
            raise ValueError("; ".join(problems))
        return self


def _loc(loc: tuple) -> str:
    return "/" + "/".join(str(p) for p in loc) if loc else "(top level)"


def validate_design(data: Any, task_id: str | None = None) -> tuple[ModelDesign | None, list[str]]:
    """Check a submitted design.

    Args:
        data: the decoded design (a mapping) or its JSON text.
        task_id: the run's task; the design's ``task`` must equal it.

    Returns:
        ``(design, [])`` when valid, else ``(None, problems)``: one line per problem, naming
        the field as a JSON pointer (``/L3/0/serves: ...``), ready to show to the agent.
    """
    if isinstance(data, (str, bytes)):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as e:
            return None, [f"(top level): not valid JSON: {e}"]
    if not isinstance(data, dict):
        return None, [f"(top level): the design must be a JSON object, got {type(data).__name__}"]
    size = len(json.dumps(data, separators=(",", ":"), ensure_ascii=False))
    if size > MAX_DESIGN_CHARS:
        return None, [f"(top level): the design has {size} characters of JSON; at most {MAX_DESIGN_CHARS} are "
                      "accepted: be concise"]
    try:
        design = ModelDesign.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            msg = err["msg"].removeprefix("Value error, ")
            if err["loc"]:
                problems.append(f"{_loc(err['loc'])}: {msg}")
            else:  # cross-reference problems: already located, one per line
                problems += [m if m.startswith("/") else f"(top level): {m}" for m in msg.split("; ")]
        return None, problems
    if task_id is not None and design.task != task_id:
        return None, [f"/task: the design is for task {design.task!r}, this run's task is {task_id!r}"]
    return design, []


def design_leaves(design: dict) -> dict[str, str]:
    """Every text of a design by JSON pointer (``/L1/0/causal_chain/bottleneck`` -> text), in
    document order. Scalars other than strings are rendered with ``json.dumps``; keys are not
    leaves. These are the passages a design judge may quote."""
    out: dict[str, str] = {}

    def walk(node: Any, ptr: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{ptr}/{str(k).replace('~', '~0').replace('/', '~1')}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{ptr}/{i}")
        elif isinstance(node, str):
            out[ptr or "/"] = node
        elif node is not None:
            out[ptr or "/"] = json.dumps(node)

    walk(design, "")
    return out
