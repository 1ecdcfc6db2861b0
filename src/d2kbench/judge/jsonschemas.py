"""JSON Schemas exported from the judge's pydantic models.

* :func:`published_schema`: the schema as published in the repository
  (``judge/schemas/*.schema.json``, draft 2020-12, with ``$defs``), for people and tools.
* :func:`provider_schema`: the same model as a self-contained schema for a model provider:
  references inlined (some providers reject ``$ref`` in tool parameters), titles and defaults
  dropped. With ``strict=True`` it is also checked against the rules of strict
  structured-output modes (every object closed, every property required), so the same schema
  serves OpenAI ``response_format`` / Responses ``text.format``, an Anthropic forced tool and
  ``codex exec --output-schema``.

``python -m d2kbench.judge.jsonschemas`` rewrites the published files; a test checks that
they match the models.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

from pydantic import BaseModel

from d2kbench.judge.design_schema import ModelDesign
from d2kbench.judge.verdict import DesignVerdict, ImplVerdict

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"
_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _models() -> dict[str, type[BaseModel]]:
    return {"model_design.schema.json": ModelDesign, "impl_verdict.schema.json": ImplVerdict,
            "design_verdict.schema.json": DesignVerdict}


def published_schema(model: type[BaseModel], file_name: str) -> dict:
    """The schema of ``model`` as published under ``judge/schemas/<file_name>``."""
    schema = model.model_json_schema()
    return {"$schema": _DIALECT, **schema}


def inline_refs(schema: dict) -> dict:
    """``schema`` with every local ``$ref`` to ``#/$defs/...`` replaced by its definition and
    ``$defs`` removed.

    Raises:
        ValueError: a reference that is not local, is unknown, or is recursive.
    """
    defs = schema.get("$defs", {})

    def resolve(node, stack: tuple[str, ...]):
        if isinstance(node, dict):
            if "$ref" in node:
                ref = node["$ref"]
                if not ref.startswith("#/$defs/"):
                    raise ValueError(f"cannot inline non-local reference {ref!r}")
                name = ref.removeprefix("#/$defs/")
                if name not in defs:
                    raise ValueError(f"unknown reference {ref!r}")
                if name in stack:
                    raise ValueError(f"recursive reference {ref!r} cannot be inlined")
                target = resolve(copy.deepcopy(defs[name]), stack + (name,))
                extra = {k: v for k, v in node.items() if k != "$ref"}
                return {**target, **resolve(extra, stack)}
            return {k: resolve(v, stack) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [resolve(v, stack) for v in node]
        return node

    return resolve(schema, ())


def _strip(node, keys: tuple[str, ...]):
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k in keys:
                continue
            if k == "properties":  # property names are data, not keywords
                out[k] = {name: _strip(sub, keys) for name, sub in v.items()}
            else:
                out[k] = _strip(v, keys)
        return out
    if isinstance(node, list):
        return [_strip(v, keys) for v in node]
    return node


def strict_problems(schema: dict, path: str = "") -> list[str]:
    """Where ``schema`` breaks the rules of strict structured outputs: an object that is not
    closed (``additionalProperties: false``) or has a property missing from ``required``, a
    node without ``type`` (outside ``anyOf``), or a string-length keyword."""
    problems: list[str] = []
    if not isinstance(schema, dict):
        return problems
    if "anyOf" in schema:
        for i, sub in enumerate(schema["anyOf"]):
            problems += strict_problems(sub, f"{path}/anyOf/{i}")
        return problems
    if "type" not in schema and "enum" not in schema and "const" not in schema:
        problems.append(f"{path or '/'}: no type")
    for kw in ("minLength", "maxLength", "pattern"):
        if kw in schema:
            problems.append(f"{path or '/'}: keyword {kw} is not accepted by every strict mode")
    if schema.get("type") == "object":
        if schema.get("additionalProperties") is not False:
            problems.append(f"{path or '/'}: additionalProperties must be false")
        props = schema.get("properties", {})
        missing = sorted(set(props) - set(schema.get("required", [])))
        if missing:
            problems.append(f"{path or '/'}: properties not required: {', '.join(missing)}")
        for name, sub in props.items():
            problems += strict_problems(sub, f"{path}/properties/{name}")
    if schema.get("type") == "array":
        problems += strict_problems(schema.get("items", {}), f"{path}/items")
    return problems


def provider_schema(model: type[BaseModel], *, strict: bool = False) -> dict:
    """A self-contained schema of ``model`` for a provider (see the module docstring).

    Raises:
        ValueError: ``strict`` and the model's schema breaks a strict-mode rule.
    """
    schema = _strip(inline_refs(model.model_json_schema()), ("title", "default"))
    if strict:
        problems = strict_problems(schema)
        if problems:
            raise ValueError(f"{model.__name__} is not a strict schema: " + "; ".join(problems))
    return schema


def write_published(directory: Path = SCHEMA_DIR) -> list[Path]:
    """(Re)write the published schema files; returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, model in _models().items():
        p = directory / name
        p.write_text(json.dumps(published_schema(model, name), indent=2, ensure_ascii=False) + "\n")
        paths.append(p)
    return paths


def stale_published(directory: Path = SCHEMA_DIR) -> list[str]:
    """Names of published schema files that are missing or differ from their models."""
    stale = []
    for name, model in _models().items():
        p = directory / name
        if not p.is_file() or json.loads(p.read_text()) != published_schema(model, name):
            stale.append(name)
    return stale


def main(argv: list[str] | None = None) -> None:
    """Rewrite (default) or check (``--check``) the published schema files."""
    ap = argparse.ArgumentParser(prog="python -m d2kbench.judge.jsonschemas", description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when a published file is stale")
    a = ap.parse_args(argv)
    if a.check:
        stale = stale_published()
        for s in stale:
            print(f"stale: {SCHEMA_DIR / s}")
        raise SystemExit(1 if stale else 0)
    for p in write_published():
        print(p)


if __name__ == "__main__":
    main()
