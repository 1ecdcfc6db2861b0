"""Independent design runs (docs/protocol.md, "Runs"): ``d2k design TASK --model M --backend B``.

The agent gets the task's shared files only: ``task.yaml``, ``reference.py`` and
``requirements.md`` (no guidance, no template, no code, no tool that runs anything). Its one
tool is ``submit_design``, whose arguments are the design (``model_design.json``, schema
:class:`d2kbench.judge.design_schema.ModelDesign`, published under ``judge/schemas/``). A
submission that fails the schema or its cross-references is answered with the list of
problems as the tool result, so the agent can fix them within its turn budget; the first
accepted submission ends the run. A response without a tool call gets a reminder (it still
counts as a turn). Turn = one model response; the harness enforces the budget itself.

The run is stored like agent runs (``runs`` with ``guidance='design'``, ``turns`` with usage
and cost, ``events`` with the trajectory); the accepted design is in the run's
``summary_json["design"]`` and in ``<runs_dir>/<run_id>/model_design.json``.

Only API backends (``openai``, ``anthropic``) are supported: the Claude Code and Codex CLIs
bring their own shell and file tools, which a design run must not offer.
"""

from __future__ import annotations

import hashlib
import json
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from d2kbench.agents.backends import BackendError, MalformedOutputError, get_backend
from d2kbench.agents.recording import RunRecorder, task_leak_paths
from d2kbench.agents.runner import backend_keys, prices_or_event
from d2kbench.agents.workspace import TARGET_GPU
from d2kbench.judge.design_schema import SCHEMA_VERSION, ModelDesign, validate_design
from d2kbench.judge.jsonschemas import provider_schema
from d2kbench.judge.prompts import load_prompt, prompt_version
from d2kbench.judge.targets import design_sha256
from d2kbench.store import Store
from d2kbench.store.redact import secret_values
from d2kbench.tasks import load_task

#: Guidance label of design runs in the ``runs`` table.
DESIGN_GUIDANCE = "design"
#: Default turn budget of a design run (model responses).
DEFAULT_DESIGN_BUDGET = 20
#: The shared task files a design agent reads (no template: it writes no code).
DESIGN_FILES = ("task.yaml", "reference.py", "requirements.md")
#: Backends a design run can use (the harness must own the only tool).
DESIGN_BACKENDS = ("openai", "anthropic")
SUBMIT_TOOL = "submit_design"
NUDGE = (f"You have not submitted a design yet. Call the `{SUBMIT_TOOL}` tool with your model_design.json "
         "as its arguments; that is the only way to deliver the design.")


#: The fields of a design run's identity (:meth:`DesignRunSpec.key`): the experiment, not the
#: endpoint, its credentials or the response length.
DESIGN_IDENTITY_FIELDS = ("task", "model", "backend", "seed", "budget_turns")


class DesignRunSpec(BaseModel):
    """One design run. Its identity (:meth:`key`) is :data:`DESIGN_IDENTITY_FIELDS`, as for
    agent runs (docs/protocol.md, "Run identity and secrets")."""

    model_config = ConfigDict(extra="forbid")
    task: str
    model: str
    backend: str
    seed: int = 0
    budget_turns: int = Field(default=DEFAULT_DESIGN_BUDGET, ge=1)
    base_url: str | None = None
    backend_options: dict = Field(default_factory=dict)
    max_tokens: int = Field(default=16384, ge=256)
    campaign: str | None = None

    @field_validator("backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        if v not in DESIGN_BACKENDS:
            raise ValueError(f"design runs need an API backend ({', '.join(DESIGN_BACKENDS)}); {v!r} is not one "
                             "(agent CLIs bring shell and file tools that a design run must not offer)")
        return v

    def key(self) -> str:
        """A stable 16-hex-digit identity (its attempts share it): a hash of
        :data:`DESIGN_IDENTITY_FIELDS` and the design guidance only."""
        ident = {**self.model_dump(mode="json", include=set(DESIGN_IDENTITY_FIELDS)), "guidance": DESIGN_GUIDANCE}
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]

    def keys(self) -> list[str]:
        """Every key a recorded attempt may carry: :meth:`key`, then the identity older versions
        gave it (every field but ``campaign``, endpoint and options included)."""
        ident = {**self.model_dump(mode="json", exclude={"campaign"}), "guidance": DESIGN_GUIDANCE}
        legacy = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
        return list(dict.fromkeys((self.key(), legacy)))


class DesignRunOutcome(BaseModel):
    """How a design run ended, as the store has it."""

    run_id: str
    status: str
    exit_reason: str | None = None
    error: str | None = None
    turns: int = 0
    submissions: int = 0
    accepted: bool = False
    design_path: str | None = None
    cost_usd: float | None = 0.0  # None: a model without a price (unknown, never US$0)


def submit_tool() -> dict:
    """The ``submit_design`` tool (neutral format): its parameters are the design schema."""
    return {"name": SUBMIT_TOOL,
            "description": ("Submit your design document (model_design.json). The arguments ARE the document. "
                            "Returns 'accepted', or the list of problems to fix before submitting again."),
            "parameters": provider_schema(ModelDesign)}


def shared_files_text(task) -> str:
    """The shared task files as Markdown sections with fenced contents."""
    parts = []
    for name in DESIGN_FILES:
        body = (task.root / name).read_text().rstrip("\n")
        lang = {"yaml": "yaml", "py": "python", "md": "markdown"}[name.rsplit(".", 1)[1]]
        parts.append(f"### {name}\n\n````{lang}\n{body}\n````")
    return "\n\n".join(parts)


def design_prompts(task, budget_turns: int) -> tuple[str, str, str]:
    """``(system, first user message, prompt version)`` of a design run on ``task``."""
    system_p, task_p = load_prompt("design_agent_system"), load_prompt("design_agent_task")
    system = system_p.render(target_gpu=TARGET_GPU, budget_turns=budget_turns)
    user = task_p.render(task_id=task.id, task_title=task.spec.title, files=shared_files_text(task))
    return system, user, prompt_version(system_p, task_p)


def _rejection(problems: list[str]) -> str:
    shown = problems[:40]
    more = f"\n- ... and {len(problems) - len(shown)} more" if len(problems) > len(shown) else ""
    n = len(problems)
    return (f"The design was NOT accepted: {n} problem{'s' if n != 1 else ''}.\n"
            + "\n".join(f"- {p}" for p in shown) + more
            + f"\nFix them and call {SUBMIT_TOOL} again with the complete document.")


def run_design(spec: DesignRunSpec, *, store_path: str | Path, runs_root: str | Path = "runs",
               attempt: int | None = None, backend=None,
               progress: Callable[[str], None] | None = None) -> DesignRunOutcome:
    """Run one independent design session to its end and record it.

    Args:
        spec: the run.
        store_path: the SQLite store.
        runs_root: where run directories go (``<runs_root>/<run_id>/model_design.json``).
        attempt: attempt number (default: one more than the stored attempts of this spec).
        backend: an already constructed backend (default: ``get_backend`` from the spec).
        progress: called with short status lines.

    Returns:
        The outcome; the run row is ``finished`` (``completed``: a design was accepted;
        ``budget``: none within the budget) or ``failed`` (provider or harness error).
    """
    say = progress or (lambda _m: None)
    store = Store(store_path)
    store.add_secrets([*secret_values(spec.backend_options), *backend_keys(backend)])
    key = spec.key()
    attempt = attempt or max([0, *(r["attempt"] for k in spec.keys() for r in store.runs_of(run_key=k))]) + 1
    run_id = f"{key}-a{attempt}"
    run_dir = Path(runs_root).resolve() / run_id
    task = load_task(spec.task)
    system, user, version = design_prompts(task, spec.budget_turns)
    tool = submit_tool()
    _start_run(store, spec, run_id, attempt, run_dir, version, tool)
    rec = RunRecorder(store, run_id, prices_or_event(store, run_id), task_leak_paths(task.root))
    session = _Session()
    status = "failed"
    messages: list[dict] = [{"role": "user", "content": user}]
    rec.event(0, "message", {"role": "user", "content": user})
    say(f"design run {run_id}: {spec.task} | {spec.model} ({spec.backend}), budget {spec.budget_turns} turns")
    try:
        if backend is None:
            backend = get_backend(spec.backend, spec.model, spec.base_url, **spec.backend_options)
        store.add_secrets(backend_keys(backend))
        _converse(backend, spec, system, tool, messages, rec, session, say)
        if session.design is not None:
            session.exit_reason = "completed"
        status = "finished" if session.exit_reason in ("completed", "budget") else "failed"
    except BackendError as e:
        session.exit_reason, session.error = ("config_error" if e.kind == "config" else "provider_error"), str(e)
        store.add_event(run_id, session.turn, "error", {"kind": e.kind, "message": str(e)})
    except Exception as e:  # noqa: BLE001 - recorded, never lost
        session.exit_reason = "harness_error"
        session.error = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}"
        store.add_event(run_id, session.turn, "error", {"kind": "harness", "message": session.error})
    finally:
        if backend is not None:
            backend.close()
    design_path = _write_design(session.design, run_dir)
    rec.finalize_totals()
    _finish_run(store, run_id, status, session, rec, version, design_path, say)
    return DesignRunOutcome(run_id=run_id, status=status, exit_reason=session.exit_reason, error=session.error,
                            turns=rec.turns, submissions=session.submissions, accepted=session.design is not None,
                            design_path=str(design_path) if design_path else None, cost_usd=rec.cost_usd)


@dataclass
class _Session:
    """Where a design session stands, updated response by response: the accepted design (None
    until one is), submissions made and rejected, model responses so far (``turn``), malformed
    responses in a row, and why it ended (``exit_reason``, ``error``: None while it runs)."""

    design: dict | None = None
    submissions: int = 0
    rejected: int = 0
    turn: int = 0
    malformed: int = 0
    exit_reason: str | None = None
    error: str | None = None


def _start_run(store: Store, spec: DesignRunSpec, run_id: str, attempt: int, run_dir: Path, version: str,
               tool: dict) -> None:
    """Record the run's row (``running``) with its configuration: the spec, the run folder, the
    prompt and design-schema versions and the SHA-256 of the submit tool's schema."""
    store.start_run(run_id, task=spec.task, model=spec.model, backend=spec.backend, guidance=DESIGN_GUIDANCE,
                    seed=spec.seed, budget_turns=spec.budget_turns, campaign=spec.campaign, run_key=spec.key(),
                    attempt=attempt, config={**spec.model_dump(mode="json"), "run_dir": str(run_dir),
                                             "prompt_version": version, "design_schema_version": SCHEMA_VERSION,
                                             "tool_schema_sha256": hashlib.sha256(
                                                 json.dumps(tool, sort_keys=True).encode()).hexdigest()})


def _converse(backend, spec: DesignRunSpec, system: str, tool: dict, messages: list[dict], rec: RunRecorder,
              session: _Session, say: Callable[[str], None]) -> None:
    """Ask the model, response by response, until a design is accepted, the turn budget is spent
    (``exit_reason="budget"``) or three malformed responses come in a row
    (``"provider_error"``). A response without a tool call gets ``NUDGE``; each tool call gets
    its answer as a tool result. ``messages`` and ``session`` are updated in place.

    Raises:
        BackendError: the provider failed (the caller records it).
    """
    while session.design is None:
        if session.turn >= spec.budget_turns:
            session.exit_reason = "budget"
            return
        try:
            comp = backend.complete(messages, system=system, tools=[tool], max_tokens=spec.max_tokens)
        except MalformedOutputError as e:
            session.malformed += 1
            rec.event(session.turn, "error", {"kind": "malformed", "message": str(e), "attempt": session.malformed})
            if session.malformed >= 3:
                session.exit_reason = "provider_error"
                session.error = f"{session.malformed} malformed responses in a row; last: {e}"
                return
            continue
        session.malformed = 0
        session.turn += 1
        turn = session.turn
        rec.turn(turn, comp.usage, comp.model or spec.model, retries=comp.retries)
        messages.append(comp.message())
        rec.event(turn, "message", {"role": "assistant", "content": comp.text, "stop_reason": comp.stop_reason,
                                    "tool_calls": [tc.model_dump(exclude_none=True) for tc in comp.tool_calls]})
        if not comp.tool_calls:
            messages.append({"role": "user", "content": NUDGE})
            rec.event(turn, "message", {"role": "user", "content": NUDGE})
            say(f"turn {turn}: no submission")
            continue
        for tc in comp.tool_calls:
            rec.event(turn, "tool_call", tc.model_dump(exclude_none=True))
            text, is_error = _answer_call(tc, spec.task, rec, session, say)
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": text, "is_error": is_error})
            rec.event(turn, "tool_result", {"tool_call_id": tc.id, "name": tc.name, "ok": not is_error,
                                            "content": text[:4000]})


def _answer_call(tc, task_id: str, rec: RunRecorder, session: _Session,
                 say: Callable[[str], None]) -> tuple[str, bool]:
    """``(tool result text, is_error)`` of one tool call: a submission is validated against the
    design schema (``session.design`` is set when it is accepted, the first one only); bad
    arguments, another tool, or a second submission after an accepted one are errors."""
    turn = session.turn
    if tc.arguments_error:
        return f"error: {tc.arguments_error}. Call {SUBMIT_TOOL} again with a JSON object.", True
    if tc.name != SUBMIT_TOOL:
        return f"unknown tool {tc.name!r}: the only tool of this session is {SUBMIT_TOOL}", True
    if session.design is not None:
        return "A design was already accepted in this response; this call is ignored.", True
    session.submissions += 1
    _, problems = validate_design(tc.arguments, task_id)
    if problems:
        session.rejected += 1
        text = _rejection(problems)
        rec.event(turn, "design_rejected", {"submission": session.submissions, "problems": problems})
        say(f"turn {turn}: submission {session.submissions} rejected ({len(problems)} problem"
            f"{'s' if len(problems) != 1 else ''})")
        return text, True
    session.design = dict(tc.arguments)
    rec.event(turn, "design_accepted", {"submission": session.submissions})
    say(f"turn {turn}: submission {session.submissions} accepted")
    return "Design accepted. The session is over.", False


def _write_design(design: dict | None, run_dir: Path) -> Path | None:
    """Write the accepted design to ``<run_dir>/model_design.json``; its path, or None when no
    design was accepted."""
    if design is None:
        return None
    run_dir.mkdir(parents=True, exist_ok=True)
    design_path = run_dir / "model_design.json"
    design_path.write_text(json.dumps(design, indent=2, ensure_ascii=False) + "\n")
    return design_path


def _finish_run(store: Store, run_id: str, status: str, session: _Session, rec: RunRecorder, version: str,
                design_path: Path | None, say: Callable[[str], None]) -> None:
    """Close the run's row (status, exit reason, cost in US$ or None when a model has no price,
    the summary with the design and its SHA-256) and the store."""
    design = session.design
    summary = {"design": design, "design_sha256": design_sha256(design) if design else None,
               "design_path": str(design_path) if design_path else None, "submissions": session.submissions,
               "rejected_submissions": session.rejected, "turns": rec.turns, "usage": rec.usage.model_dump(),
               "unpriced_models": sorted(rec.unpriced), "prompt_version": version}
    store.finish_run(run_id, status=status, exit_reason=session.exit_reason, error=session.error,
                     cost_usd=rec.cost_usd, summary=summary)
    store.close()
    say(f"design run {run_id}: {status} ({session.exit_reason}); {session.submissions} submissions, "
        f"{'accepted' if design else 'no accepted design'}; cost "
        + (f"${rec.cost_usd:.4f}" if rec.cost_usd is not None else f"unknown (no price for {', '.join(sorted(rec.unpriced))})"))
