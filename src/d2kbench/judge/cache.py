"""Reproducibility: the hash of every input of a verdict, and cached verdicts in the store.

A verdict is cached under the SHA-256 of a canonical JSON of everything that can change it:
the judge kind, the rendered prompts (which contain the guidance, the rubric, the expert and
candidate sources or the design), the prompt and rubric versions and the rubric file's hash,
the verification rules' version, the verdict schema, the backend, model and the options that
change its answers, and the sample index. The same inputs never reach the provider twice.
"""

from __future__ import annotations

import hashlib
import json


def canonical_json(obj) -> str:
    """Compact, key-sorted JSON of ``obj`` (non-JSON values as ``str``)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def input_hash(payload: dict) -> str:
    """SHA-256 (hex) of :func:`canonical_json` of ``payload``."""
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def sha256_text(text: str | bytes) -> str:
    """SHA-256 (hex) of a text or bytes."""
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def find_cached(store, digest: str, target: str | None = None):
    """The newest stored verdict row with input hash ``digest`` (and ``target`` when given),
    or None."""
    rows = store.verdicts_by_hash(digest)
    if target is not None:
        rows = [r for r in rows if r["target"] == target]
    return rows[-1] if rows else None
