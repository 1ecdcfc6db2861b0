"""Token cost from a dated price table (``prices.yaml`` in the repository root).

Cost is a pure function of usage buckets and one price entry: :func:`cost_usd`. The table is
found at ``$D2K_PRICES``, else ``./prices.yaml``, else the repository root of this source tree.
"""

from __future__ import annotations

import datetime as dt
import os
from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from d2kbench.agents.backends.base import Usage

_REPO_PRICES = Path(__file__).resolve().parents[3] / "prices.yaml"


class PerMTok(BaseModel):
    """US$ per million tokens of each usage bucket."""

    model_config = ConfigDict(extra="forbid")
    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cache_read: float = Field(ge=0)
    cache_write_5m: float = Field(ge=0)
    cache_write_1h: float = Field(ge=0)


class LongContext(BaseModel):
    """Multipliers for a request whose prompt exceeds ``above_input_tokens`` tokens."""

    model_config = ConfigDict(extra="forbid")
    above_input_tokens: int = Field(gt=0)
    input_multiplier: float = Field(gt=0)
    output_multiplier: float = Field(gt=0)


class PriceEntry(BaseModel):
    """One model's prices, with the date they were read and their source."""

    model_config = ConfigDict(extra="forbid")
    provider: str
    aliases: list[str] = Field(default_factory=list)
    per_mtok: PerMTok
    as_of: dt.date
    source: str = Field(min_length=8)
    long_context: LongContext | None = None


class PriceTable(BaseModel):
    """``prices.yaml``: a version date and model entries."""

    model_config = ConfigDict(extra="forbid")
    version: dt.date
    models: dict[str, PriceEntry]

    def lookup(self, model: str) -> tuple[str, PriceEntry] | None:
        """(canonical name, entry) for a model id or alias; a dated id such as
        ``claude-sonnet-4-6-20260101`` matches its undated entry. None when unknown."""
        if model in self.models:
            return model, self.models[model]
        for name, e in self.models.items():
            if model in e.aliases:
                return name, e
        for name in sorted(self.models, key=len, reverse=True):
            if model.startswith(name + "-") and model[len(name) + 1:].replace("-", "").isdigit():
                return name, self.models[name]
        return None


def default_path() -> Path:
    """Where the price table is read from (see the module docstring)."""
    env = os.environ.get("D2K_PRICES")
    if env:
        return Path(env)
    local = Path("prices.yaml")
    return local if local.is_file() else _REPO_PRICES


@lru_cache(maxsize=8)
def _load(path: str, mtime: float) -> PriceTable:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from None
    try:
        return PriceTable.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
        raise ValueError(f"{path}: invalid price table: {problems}") from None


def load_prices(path: str | Path | None = None) -> PriceTable:
    """Read and validate a price table.

    Raises:
        FileNotFoundError: no such file.
        ValueError: malformed YAML or a missing / invalid field (named in the message).
    """
    p = Path(path) if path else default_path()
    if not p.is_file():
        raise FileNotFoundError(f"price table {p} not found (set $D2K_PRICES or add prices.yaml)")
    return _load(str(p.resolve()), p.stat().st_mtime)


def cost_usd(usage: Usage, entry: PriceEntry) -> float:
    """US$ of one model response's usage (apply per response: long-context multipliers
    depend on the size of each request's prompt)."""
    p = entry.per_mtok
    mi = mo = 1.0
    lc = entry.long_context
    if lc is not None and usage.total_input > lc.above_input_tokens:
        mi, mo = lc.input_multiplier, lc.output_multiplier
    return (mi * (usage.input_tokens * p.input + usage.cache_read * p.cache_read
                  + usage.cache_write_5m * p.cache_write_5m + usage.cache_write_1h * p.cache_write_1h)
            + mo * usage.output_tokens * p.output) / 1e6


def price_turn(usage: Usage, model: str, table: PriceTable | None) -> float | None:
    """US$ of one turn of ``model``, or None when the model has no price in ``table``."""
    if table is None:
        return None
    hit = table.lookup(model)
    return cost_usd(usage, hit[1]) if hit else None
