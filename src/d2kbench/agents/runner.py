"""One agent run: (task, model, backend, guidance level, seed, budget) -> a recorded trajectory,
candidates and a final answer in the store.

``run_agent`` stages a workspace under ``RUNS_ROOT/<run_id>/workspace`` (submissions go to
``RUNS_ROOT/<run_id>/control``, outside the workspace), starts the run in the store
(status ``running``), drives the backend (built-in loop for API backends, the CLI's own loop
for ``claude-code`` / ``codex``), has every submission evaluated by the harness, records the
final answer chosen by the scoring rule (:func:`d2kbench.scoring.selection.final_candidate`:
the eligible candidate with the lowest geometric-mean latency; the speedups each evaluation
measured against its own re-timed baseline do not choose) and closes the run (``finished``, or
``failed`` with the error). It never raises for a failing agent, provider or CLI; a recorded
result is never lost.

A run's identity (:meth:`RunSpec.key`) is the experiment: task, model, backend, guidance,
seed and budget, not the endpoint or its credentials, so moving an endpoint or rotating a key
does not start a campaign's runs again. Secrets in the backend options never reach the store
(:mod:`d2kbench.store.redact`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import platform
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from d2kbench.agents.backends import BACKENDS, BackendError, get_backend
from d2kbench.agents.loop import Toolbox, run_loop
from d2kbench.agents.pricing import PriceTable, load_prices, price_turn
from d2kbench.agents.recording import RunRecorder, task_leak_paths
from d2kbench.agents.submissions import SubmissionQueue, remove_tree, set_turn, snapshot
from d2kbench.agents.tools import ToolOutput
from d2kbench.agents.workspace import GUIDANCE_LEVELS, EvalSettings, load_config, mcp_server_spec, stage_workspace
from d2kbench.machine import host_id
from d2kbench.scoring.metrics import ScoringError
from d2kbench.scoring.stored import final_of_run
from d2kbench.store import Store
from d2kbench.store.redact import secret_values
from d2kbench.tasks import load_task

#: Default turn budget (docs/protocol.md, "Runs") and wall-clock limit (s).
DEFAULT_BUDGET_TURNS = 350
DEFAULT_WALL_CLOCK_S = 6 * 3600.0

PROMPT = ("Implement `run(...)` in `solution.py` for the task described in CLAUDE.md (the same text is in "
          "AGENTS.md): read it first, then task.yaml, requirements.md, reference.py and workloads.yaml{guidance}. "
          "Use the tools (test, bench, profile, submit) as the brief explains. Submit every correct improvement: "
          "your final answer is the fully correct submission with the highest geometric-mean speedup.")


#: The fields of a run's identity (:meth:`RunSpec.key`): the experiment, not where it runs.
IDENTITY_FIELDS = ("task", "model", "backend", "guidance", "seed", "budget_turns", "wall_clock_s")


class RunSpec(BaseModel):
    """What one run is. Its identity (:meth:`key`) is :data:`IDENTITY_FIELDS`; the endpoint
    (``base_url``), the backend options (keys included), the device and the evaluation
    settings are how it runs, and ``campaign`` is where it is filed."""

    model_config = ConfigDict(extra="forbid")
    task: str
    model: str
    backend: str
    guidance: str
    seed: int = 0
    budget_turns: int = Field(default=DEFAULT_BUDGET_TURNS, ge=1)
    wall_clock_s: float | None = Field(default=DEFAULT_WALL_CLOCK_S, gt=0)
    base_url: str | None = None
    backend_options: dict = Field(default_factory=dict)
    device: Literal["auto", "cuda", "cpu"] = "auto"
    eval: EvalSettings = Field(default_factory=EvalSettings)
    max_tokens: int = Field(default=16384, ge=1)
    campaign: str | None = None

    @field_validator("backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        if v not in BACKENDS:
            raise ValueError(f"unknown backend {v!r} (known: {', '.join(BACKENDS)})")
        return v

    @field_validator("guidance")
    @classmethod
    def _guidance(cls, v: str) -> str:
        if v not in GUIDANCE_LEVELS:
            raise ValueError(f"unknown guidance level {v!r} (one of: {', '.join(GUIDANCE_LEVELS)})")
        return v

    def key(self) -> str:
        """A stable 16-hex-digit identity of the run (its attempts share it): a hash of
        :data:`IDENTITY_FIELDS` only."""
        ident = self.model_dump(mode="json", include=set(IDENTITY_FIELDS))
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]

    def legacy_key(self) -> str:
        """The identity older versions gave this run (every field but ``campaign``, endpoint
        and options included); a resume recognises runs recorded under it."""
        ident = self.model_dump(mode="json", exclude={"campaign"})
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]

    def keys(self) -> list[str]:
        """Every key a recorded attempt of this run may carry: :meth:`key`, then :meth:`legacy_key`."""
        return list(dict.fromkeys((self.key(), self.legacy_key())))

    def label(self) -> str:
        return f"{self.task} | {self.model} ({self.backend}) | {self.guidance} | seed {self.seed}"


class RunOutcome(BaseModel):
    """A finished (or failed) run as the store has it.

    ``final_speedup``: the final candidate's geomean speedup as its own evaluation measured it
    (against a baseline re-timed in that evaluation; reports recompute it against one fixed
    baseline). ``cost_usd``: None when a model of the run has no price (``unpriced_models``).
    """

    run_id: str
    run_key: str
    status: str
    exit_reason: str | None = None
    error: str | None = None
    turns: int = 0
    candidates: int = 0
    final_candidate: int | None = None
    final_speedup: float | None = None
    cost_usd: float | None = 0.0
    cli_cost_usd: float | None = None
    unpriced_models: list[str] = []


def record_final(store, run_id: str) -> tuple[dict | None, str | None]:
    """(candidate row of the final answer by the scoring rule or None, why none could be
    chosen or None) of a run, from its stored candidates and their evaluations."""
    try:
        final, _ = final_of_run(store, run_id)
    except ScoringError as e:
        return None, str(e)
    if final is None:
        return None, None
    return next(dict(c) for c in store.candidates_of(run_id) if c["id"] == final.id), None


def backend_keys(backend) -> list[str]:
    """The API keys a constructed backend holds (a CLI backend's ``api_key``, an SDK client's
    ``client.api_key``), for the store to keep out of every record."""
    if backend is None:
        return []
    keys = [getattr(backend, "api_key", None), getattr(getattr(backend, "client", None), "api_key", None)]
    return [k for k in keys if isinstance(k, str)]


def _versions(backend) -> dict:
    out = {"python": platform.python_version()}
    for pkg in ("d2kbench", "torch", "triton", "openai", "anthropic"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    if getattr(backend, "is_cli", False):
        try:
            out["cli"] = backend.version()
        except Exception as e:  # noqa: BLE001
            out["cli"] = f"unknown ({e})"
    return out


def run_agent(spec: RunSpec, *, store_path: str | Path, runs_root: str | Path, attempt: int = 1,
              backend=None, progress: Callable[[str], None] | None = None) -> RunOutcome:
    """Run one agent run to its end and record it.

    Args:
        spec: the run.
        store_path: the SQLite store.
        runs_root: where run directories go (``<runs_root>/<run_id>/``).
        attempt: attempt number (a resumed campaign starts the next attempt of an interrupted run).
        backend: an already constructed backend (default: ``get_backend`` from the spec).
        progress: called with short status lines.

    Returns:
        The :class:`RunOutcome`; the run row is ``finished`` or ``failed`` either way.

    Raises:
        sqlite3.IntegrityError: the run id exists already (the caller chose a used attempt).
    """
    say = progress or (lambda _m: None)
    key = spec.key()
    run_id = f"{key}-a{attempt}"
    run_dir = Path(runs_root).resolve() / run_id
    Path(store_path).parent.mkdir(parents=True, exist_ok=True)
    store = Store(store_path)
    store.add_secrets([*secret_values(spec.backend_options), *backend_keys(backend)])
    store.start_run(run_id, task=spec.task, model=spec.model, backend=spec.backend, guidance=spec.guidance,
                    seed=spec.seed, budget_turns=spec.budget_turns, campaign=spec.campaign, run_key=key,
                    attempt=attempt, config={**spec.model_dump(mode="json"), "run_dir": str(run_dir),
                                             "pid": os.getpid(), "host": host_id()})
    status, exit_reason, error = "failed", None, None
    summary: dict = {}
    recorder = None
    queue = None
    try:
        remove_tree(run_dir)
        task = load_task(spec.task)
        control = run_dir / "control"
        ws = stage_workspace(task, run_dir / "workspace", spec.guidance, device=spec.device, eval_settings=spec.eval,
                             run_dir=control, runner=True, run_id=run_id, budget_turns=spec.budget_turns,
                             wall_clock_s=spec.wall_clock_s)
        cfg = load_config(ws)
        recorder = RunRecorder(store, run_id, prices_or_event(store, run_id), task_leak_paths(task.root))
        if backend is None:
            backend = get_backend(spec.backend, spec.model, spec.base_url, **spec.backend_options)
        store.add_secrets(backend_keys(backend))  # a key the backend read from its environment
        summary["versions"] = _versions(backend)
        turn_box = [0]  # the current turn, as the runner counts it (submissions are attributed to it)
        queue = SubmissionQueue(ws, Path(store_path), run_id, turn_of=lambda: turn_box[0],
                                on_result=lambda r: say(f"candidate {r.n}: {r.status}, eligible={r.eligible}, "
                                                        f"speedup={r.geomean_speedup}"))
        prompt = PROMPT.format(guidance=", and GUIDANCE.md" if spec.guidance != "none" else "")
        say(f"run {run_id}: {spec.label()}")
        if backend.is_cli:
            exit_reason, error = _run_cli(backend, spec, ws, run_dir, control, cfg, prompt, recorder, queue,
                                          mcp_server_spec(cfg, ws), set_turn, turn_box, summary, say)
        else:
            exit_reason, error = _run_builtin(backend, spec, ws, control, cfg, prompt, recorder, queue, snapshot,
                                              set_turn, turn_box, summary, say)
        status = "finished" if exit_reason in ("completed", "budget", "timeout") else "failed"
    except BackendError as e:
        exit_reason, error = "config_error" if e.kind == "config" else "provider_error", str(e)
        store.add_event(run_id, 0, "error", {"kind": e.kind, "message": str(e)})
    except Exception as e:  # noqa: BLE001 - recorded, never lost
        exit_reason, error = "harness_error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}"
        store.add_event(run_id, 0, "error", {"kind": "harness", "message": error})
    finally:
        _stop(queue, backend, store, run_id)
    return _finish(store, run_id, key, status, exit_reason, error, recorder, summary, say)


def prices_or_event(store, run_id: str) -> PriceTable | None:
    """The price table (:func:`d2kbench.agents.pricing.load_prices`), or None, with an ``error``
    event of kind ``prices`` recorded on the run, when it cannot be read: the run goes on, its
    cost unknown."""
    try:
        return load_prices()
    except (FileNotFoundError, ValueError) as e:
        store.add_event(run_id, 0, "error", {"kind": "prices", "message": str(e)})
        return None


def _finish(store, run_id: str, key: str, status: str, exit_reason: str | None, error: str | None, recorder,
            summary: dict, say: Callable[[str], None]) -> RunOutcome:
    """Close a run: select and record its final candidate, total its cost (US$; None when a model
    has no price), write the run row's end and summary, close the store."""
    cands = store.candidates_of(run_id)
    final, why = record_final(store, run_id)
    if why:
        store.add_event(run_id, 0, "error", {"kind": "final_selection", "message": why})
    cost, cli_cost, unpriced = _totals(recorder, summary, store, run_id)
    summary.update({"candidates": len(cands), "eligible_candidates": sum(c["eligible"] for c in cands),
                    "final_speedup": final["geomean_speedup"] if final else None})
    store.finish_run(run_id, status=status, final_candidate=final["id"] if final else None, exit_reason=exit_reason,
                     error=error, cost_usd=cost, cli_cost_usd=cli_cost, summary=summary)
    store.close()
    say(f"run {run_id}: {status} ({exit_reason}); {len(cands)} candidates; final "
        f"{final['id'] if final else None}; cost " + (f"${cost:.4f}" if cost is not None else
                                                      f"unknown (no price for {', '.join(unpriced)})"))
    return RunOutcome(run_id=run_id, run_key=key, status=status, exit_reason=exit_reason, error=error,
                      turns=summary.get("turns", 0), candidates=len(cands), final_candidate=final["id"] if final else None,
                      final_speedup=final["geomean_speedup"] if final else None, cost_usd=cost, cli_cost_usd=cli_cost,
                      unpriced_models=unpriced)


def _stop(queue, backend, store, run_id: str) -> None:
    """End a run's submission queue (evaluating what was submitted before) and its backend."""
    if queue is not None:
        try:
            queue.stop()  # evaluate submissions made before the stop
        except Exception as e:  # noqa: BLE001
            store.add_event(run_id, 0, "error", {"kind": "submissions", "message": f"{type(e).__name__}: {e}"})
    if backend is not None:
        backend.close()


def _totals(recorder, summary: dict, store, run_id: str) -> tuple[float | None, float | None, list[str]]:
    """(cost in USD by our price table, the CLI's own cost, models without a price) of a run;
    the recorder's totals (turns, usage, retries, leak suspects, price table) go into ``summary``.
    Costs are None when unknown (a model without a price, or no recorder: the run never started)."""
    if recorder is None:
        return None, None, []
    recorder.finalize_totals()
    other = summary.get("other_models_cost_usd", 0.0)
    cost = None if recorder.cost_usd is None or other is None else recorder.cost_usd + other
    summary.update({"turns": recorder.turns, "usage": recorder.usage.model_dump(), "retries": recorder.retries,
                    "unpriced_models": sorted(recorder.unpriced),
                    "leak_suspects": len(store.events_of(run_id, "leak_suspect")),
                    "price_table": str(recorder.prices.version) if recorder.prices else None})
    return cost, recorder.cli_cost_usd, sorted(recorder.unpriced)


def _run_builtin(backend, spec: RunSpec, ws: Path, control: Path, cfg, prompt: str, recorder, queue, snapshot,
                 set_turn, turn_box: list, summary: dict, say) -> tuple[str, str | None]:
    queue.start()  # tools/test, tools/submit run from the sandboxed bash reach the runner through files

    def submit(note: str, turn: int) -> ToolOutput:
        try:
            req = snapshot(ws, cfg, note=note, turn=turn, source="builtin")
        except FileNotFoundError as e:
            return ToolOutput(text=str(e), ok=False, is_error=True)
        res = queue.process(req)
        return ToolOutput(text=res.text, ok=res.status == "evaluated" and bool(res.eligible),
                          data=res.model_dump(exclude={"text"}))

    def on_turn(turn: int, comp) -> None:
        turn_box[0] = turn
        set_turn(control, turn)
        recorder.turn(turn, comp.usage, comp.model or spec.model, retries=comp.retries)
        say(f"turn {turn}: {len(comp.tool_calls)} tool calls")

    res = run_loop(backend, Toolbox(ws, submit=submit), system=(ws / "CLAUDE.md").read_text(), prompt=prompt,
                   budget_turns=spec.budget_turns, wall_clock_s=spec.wall_clock_s, on_turn=on_turn,
                   on_event=recorder.event, max_tokens=spec.max_tokens)
    summary["final_text"] = res.final_text[:4000]
    return res.exit_reason, res.error


def _run_cli(backend, spec: RunSpec, ws: Path, run_dir: Path, control: Path, cfg, prompt: str, recorder, queue,
             mcp: dict, set_turn, turn_box: list, summary: dict, say) -> tuple[str, str | None]:
    queue.start()

    def on_turn(t) -> None:
        turn_box[0] = t.index
        set_turn(control, t.index)
        recorder.turn(t.index, t.usage, t.model or spec.model)
        say(f"turn {t.index}")

    def on_event(kind: str, data: dict) -> None:
        recorder.event(data.get("turn", turn_box[0]), kind, data)

    res = backend.run_session(prompt, cwd=ws, config_dir=run_dir / "cli-home", events_path=run_dir / "events.raw.jsonl",
                              budget_turns=spec.budget_turns, timeout_s=spec.wall_clock_s, mcp_servers={"d2k": mcp},
                              on_turn=on_turn, on_event=on_event)
    queue.stop()
    # final per-turn usage (deduplicated / de-accumulated, reconciled with native session files);
    # the CLI's own cost figure for the session sits on the last turn (turns.cli_cost_usd)
    for t in res.turns:
        recorder.turn(t.index, t.usage, t.model or spec.model,
                      cli_cost_usd=res.cli_cost_usd if t is res.turns[-1] else None)
    if res.turns and res.turns[-1].index > spec.budget_turns:
        summary["over_budget_turns"] = res.turns[-1].index - spec.budget_turns
    other_cost: float | None = 0.0
    for model, u in res.other_models.items():
        c = price_turn(u, model, recorder.prices)
        if c is None:
            recorder.unpriced.add(model)
        other_cost = None if other_cost is None or c is None else other_cost + c
        recorder.event(len(res.turns), "usage_other_model", {"model": model, "usage": u.model_dump(), "cost_usd": c})
    summary["other_models_cost_usd"] = other_cost
    if res.reported_usage is not None:
        summary["cli_reported_usage"] = res.reported_usage.model_dump()
    summary["final_text"] = res.text[:4000]
    summary["cli_returncode"] = res.returncode
    if res.stderr_tail and res.exit_reason != "completed":
        summary["cli_stderr_tail"] = res.stderr_tail[-2000:]
    return res.exit_reason, res.error
