"""Recording one run's trajectory, usage and cost into the store (runs / turns / events).

:class:`RunRecorder` is the only writer of a run's turns and events in the runner process
(the submission queue writes candidates and ``candidate`` events through its own connection).
It prices every turn with the dated price table and flags tool calls that reach for held-back
files (``expert.py``, ``rubric.yaml``, the task's suite folder) as ``leak_suspect`` events.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

from d2kbench.agents.backends.base import Usage
from d2kbench.agents.pricing import PriceTable, price_turn

#: Patterns in tool-call arguments that suggest reading held-back material.
LEAK_PATTERNS = (re.compile(r"expert\.py"), re.compile(r"rubric\.ya?ml"), re.compile(r"d2kbench/suite/"),
                 re.compile(r"solutions/(expert|straightforward)"))


class RunRecorder:
    """Writes turns and events of ``run_id`` and keeps running totals.

    Args:
        store: a :class:`d2kbench.store.Store`.
        run_id: the run.
        prices: the price table (None: every cost is unknown and ``unpriced`` set).
        extra_leak_paths: further strings whose appearance in a tool call is suspect (e.g. the
            absolute path of the task folder).
    """

    def __init__(self, store, run_id: str, prices: PriceTable | None, extra_leak_paths: tuple[str, ...] = ()):
        self.store = store
        self.run_id = run_id
        self.prices = prices
        self.usage = Usage()
        self.cost_usd: float | None = 0.0
        self.cli_cost_usd: float | None = None
        self.turns = 0
        self.retries = 0
        self.unpriced: set[str] = set()
        self.leaks: list[dict] = []
        self.extra_leak = tuple(p for p in extra_leak_paths if p)
        self._lock = threading.Lock()

    def turn(self, index: int, usage: Usage, model: str, *, retries: int = 0,
             cli_cost_usd: float | None = None) -> float | None:
        """Record (or re-record) the usage of turn ``index``; returns its cost in US$, None
        when the model has no price (the turn is stored as unpriced, its cost unknown)."""
        cost = price_turn(usage, model, self.prices)
        if cost is None:
            self.unpriced.add(model)
        with self._lock:
            self.store.add_turn(self.run_id, index, input_tokens=usage.input_tokens,
                                output_tokens=usage.output_tokens, cache_read=usage.cache_read,
                                cache_write_5m=usage.cache_write_5m, cache_write_1h=usage.cache_write_1h,
                                cost_usd=cost, cli_cost_usd=cli_cost_usd, model=model,
                                reasoning_tokens=usage.reasoning_tokens, retries=retries)
        return cost

    def finalize_totals(self) -> None:
        """Recompute totals from the stored turns (the single source of truth)."""
        rows = self.store.turns_of(self.run_id)
        self.turns = len(rows)
        self.usage = Usage(input_tokens=sum(r["input_tokens"] for r in rows),
                           output_tokens=sum(r["output_tokens"] for r in rows),
                           cache_read=sum(r["cache_read"] for r in rows),
                           cache_write_5m=sum(r["cache_write_5m"] for r in rows),
                           cache_write_1h=sum(r["cache_write_1h"] for r in rows),
                           reasoning_tokens=sum(r["reasoning_tokens"] or 0 for r in rows))
        unpriced = [r for r in rows if r["unpriced"]]
        self.unpriced |= {r["model"] or "unknown model" for r in unpriced}
        self.cost_usd = None if unpriced else sum(r["cost_usd"] for r in rows)
        self.retries = sum(r["retries"] or 0 for r in rows)
        cli = [r["cli_cost_usd"] for r in rows if r["cli_cost_usd"] is not None]
        self.cli_cost_usd = sum(cli) if cli else None

    def event(self, turn: int, kind: str, data: dict) -> None:
        """Append a trajectory event; tool calls are screened for held-back files."""
        with self._lock:
            self.store.add_event(self.run_id, turn, kind, data)
            if kind == "tool_call":
                text = json.dumps(data.get("arguments", {}))
                hits = [p.pattern for p in LEAK_PATTERNS if p.search(text)]
                hits += [p for p in self.extra_leak if p in text]
                if hits:
                    leak = {"tool_call_id": data.get("id"), "name": data.get("name"), "matched": hits}
                    self.leaks.append(leak)
                    self.store.add_event(self.run_id, turn, "leak_suspect", leak)


def task_leak_paths(task_root: Path) -> tuple[str, ...]:
    """Strings that identify a task folder's held-back files on this machine."""
    root = Path(task_root).resolve()
    return (str(root / "solutions"), str(root / "rubric.yaml"))
