"""Campaign plans (``PLAN.yaml``): tasks x agents x guidance levels x seeds.

Example::

    name: hopper-paired-2026-12
    design: paired            # paired: none vs L1+L2+L3 | ablation: none, L1, L1+L2, L1+L2+L3 | custom
    tasks: [muon_newton_schulz]
    agents:
      - {model: claude-sonnet-4-6, backend: claude-code}
      - {model: gpt-5.5, backend: codex, options: {reasoning_effort: high}}
      - {model: Qwen/Qwen3-Coder, backend: openai, base_url: http://127.0.0.1:8000/v1}
    seeds: 1                  # replicates per cell (or a list of seed values)
    budget_turns: 350
    wall_clock_s: 21600
    device: auto              # cuda: one GPU per concurrent run; cpu: `concurrency` runs at once
    concurrency: 2            # CPU-only concurrency (default 1); on GPUs: the number of GPUs used
    gpus: [0, 1, 2, 3]        # optional: which GPUs (default: every visible GPU)
    eval: {baseline: reference}

A planned run's identity (``RunSpec.key``) is its task, model, backend, guidance, seed and
budget: editing a plan's budget makes new runs, never mixes budgets under one key; moving an
endpoint (``base_url``) or rotating a key in ``options`` changes nothing recorded, and a
secret in ``options`` is never written to the store. The plan is recorded in the store when
the campaign runs: its tasks x agents x levels are the declared tasks of the campaign's scores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from d2kbench.agents.backends import BACKENDS
from d2kbench.agents.runner import DEFAULT_BUDGET_TURNS, DEFAULT_WALL_CLOCK_S, RunSpec
from d2kbench.agents.workspace import GUIDANCE_LEVELS, EvalSettings
from d2kbench.scoring.records import DESIGNS
from d2kbench.tasks import TaskFileError, load_task


class PlanError(ValueError):
    """A malformed plan file; the message names the file, the field and the problem."""


class AgentSpec(BaseModel):
    """One agent of a plan: a model behind a backend."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1)
    backend: str
    base_url: str | None = None
    options: dict = Field(default_factory=dict)

    @field_validator("backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        if v not in BACKENDS:
            raise ValueError(f"unknown backend {v!r} (known: {', '.join(BACKENDS)})")
        return v


class Plan(BaseModel):
    """A campaign plan (module docstring)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    design: Literal["paired", "ablation", "custom"] = "paired"
    guidance: list[str] | None = None
    tasks: list[str] = Field(min_length=1)
    agents: list[AgentSpec] = Field(min_length=1)
    seeds: int | list[int] = 1
    budget_turns: int = Field(default=DEFAULT_BUDGET_TURNS, ge=1)
    wall_clock_s: float = Field(default=DEFAULT_WALL_CLOCK_S, gt=0)
    device: Literal["auto", "cuda", "cpu"] = "auto"
    concurrency: int | None = Field(default=None, ge=1)
    gpus: list[int] | None = None
    eval: EvalSettings = Field(default_factory=EvalSettings)
    max_tokens: int = Field(default=16384, ge=1)

    @model_validator(mode="after")
    def _levels(self) -> Plan:
        if self.design == "custom":
            if not self.guidance:
                raise ValueError("design 'custom' needs a 'guidance' list")
            bad = [g for g in self.guidance if g not in GUIDANCE_LEVELS]
            if bad:
                raise ValueError(f"unknown guidance levels {bad} (one of: {', '.join(GUIDANCE_LEVELS)})")
        elif self.guidance is not None:
            raise ValueError(f"'guidance' is only for design 'custom' (design {self.design!r} fixes the levels)")
        if isinstance(self.seeds, int) and self.seeds < 1:
            raise ValueError("seeds must be at least 1")
        return self

    def levels(self) -> list[str]:
        """The guidance levels of every cell, in plan order."""
        return list(self.guidance or ()) if self.design == "custom" else list(DESIGNS[self.design])

    def seed_values(self) -> list[int]:
        return list(range(self.seeds)) if isinstance(self.seeds, int) else list(self.seeds)

    def runs(self) -> list[RunSpec]:
        """Every planned run, pairs / ablation steps of one (task, agent, seed) adjacent."""
        out = []
        for task in self.tasks:
            for agent in self.agents:
                for seed in self.seed_values():
                    for level in self.levels():
                        out.append(RunSpec(task=task, model=agent.model, backend=agent.backend, guidance=level,
                                           seed=seed, budget_turns=self.budget_turns, wall_clock_s=self.wall_clock_s,
                                           base_url=agent.base_url, backend_options=agent.options, device=self.device,
                                           eval=self.eval, max_tokens=self.max_tokens, campaign=self.name))
        return out


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan file; unknown tasks are reported too.

    Raises:
        PlanError: missing file, bad YAML, a bad field, or an unknown task (names the cause).
    """
    p = Path(path)
    if not p.is_file():
        raise PlanError(f"{p}: plan file not found")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise PlanError(f"{p}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise PlanError(f"{p}: the plan must be a mapping, got {type(data).__name__}")
    try:
        plan = Plan.model_validate(data)
    except ValidationError as e:
        lines = [f"{p}: {'.'.join(map(str, x['loc'])) or '(top level)'}: {x['msg']}" for x in e.errors()]
        raise PlanError("\n".join(lines)) from None

    for t in plan.tasks:
        try:
            load_task(t)
        except TaskFileError as e:
            raise PlanError(f"{p}: tasks: {e}") from None
    return plan
