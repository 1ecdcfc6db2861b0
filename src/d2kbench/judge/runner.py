"""One judge assessment: prompt, model call, local re-validation, evidence verification, an
optional repair round, scoring, caching and storage.

Flow of :func:`judge` for one subject and one sample:

1. An ineligible candidate (or a design run without an accepted design) scores 0 on every
   level without a model call.
2. The inputs are rendered (:mod:`d2kbench.judge.prompts`) and hashed
   (:mod:`d2kbench.judge.cache`); a verdict already stored under that hash is returned and
   the provider is not called.
3. The backend is asked for a verdict with the strict verdict schema as ``json_schema``;
   the answer is validated again with the pydantic model and every level's evidence is
   verified (:mod:`d2kbench.judge.evidence`).
4. When the answer is malformed or a level fails verification, one repair round sends the
   problems back (if enabled). Levels that verified in the first answer are kept as they
   were; only failed levels are taken from the repaired answer, so a repair cannot raise a
   score that was already accepted. A level that still fails scores 0.
5. The verdict (both attempts, verification reports, usage) is stored in the ``verdicts``
   table with the judge model, the prompt, rubric and verifier versions, and the input hash.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

from d2kbench.agents.backends import BackendError, MalformedOutputError, Usage, get_backend
from d2kbench.agents.pricing import load_prices, price_turn
from d2kbench.judge.cache import find_cached, input_hash, sha256_text
from d2kbench.judge.design_schema import design_leaves
from d2kbench.judge.evidence import VERIFIER_VERSION, LevelCheck, verify_design_level, verify_impl_level
from d2kbench.judge.jsonschemas import provider_schema
from d2kbench.judge.prompts import (
    JudgePrompt,
    criteria_texts,
    design_prompt,
    impl_prompt,
    repair_message,
    rubric_properties,
)
from d2kbench.judge.scoring import SampleStats, judge_score, summarize, verified_score
from d2kbench.judge.targets import DesignSubject, ImplSubject, expert_source
from d2kbench.judge.verdict import LEVELS, VERDICT_MODELS, MalformedVerdict, parse_verdict
from d2kbench.store.redact import redact_url, secret_values

#: Backend options that do not change a model's answer (left out of the cache key) or are secret.
_NOT_IN_KEY = frozenset({"api_key", "http_client", "timeout_s", "retry", "on_retry", "binary", "env", "stream"})


class JudgeError(RuntimeError):
    """The judge could not produce a verdict (provider failure, or no valid verdict after the
    repair round); nothing is stored. The message names the cause."""


class JudgeConfig(BaseModel):
    """Which judge: backend name, model, endpoint and options, and how it is asked."""

    backend: str
    model: str
    base_url: str | None = None
    options: dict = Field(default_factory=dict)
    max_tokens: int = Field(default=16000, ge=256)
    repair: bool = True

    def key(self) -> dict:
        """The parts of the configuration that enter the cache key."""
        return {"backend": self.backend, "model": self.model, "base_url": self.base_url,
                "options": {k: v for k, v in sorted(self.options.items()) if k not in _NOT_IN_KEY},
                "max_tokens": self.max_tokens, "repair": self.repair}


class LevelResult(BaseModel):
    """One level of a verdict after verification."""

    raw_score: float
    score: float
    verified: bool
    repaired: bool = False
    errors: list[str] = Field(default_factory=list)
    realised: list[str] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list)
    rationale: str = ""
    evidence: list[dict] = Field(default_factory=list)
    located: list[str | None] = Field(default_factory=list)


class Attempt(BaseModel):
    """One model answer: its text, the problems found in it, its token usage."""

    text: str
    problems: list[str] = Field(default_factory=list)
    usage: dict = Field(default_factory=dict)
    model: str = ""


class JudgeRecord(BaseModel):
    """A verdict as stored (``verdicts.verdict_json``) and returned.

    ``status``: ``judged``, ``ineligible`` (incorrect candidate: 0, no model call) or
    ``no_design`` (a design run without an accepted design: 0, no model call).
    """

    kind: str
    task: str
    target: str
    status: str
    reason: str = ""
    judge: dict
    input_hash: str
    sample: int = 0
    cached: bool = False
    levels: dict[str, LevelResult]
    js: float
    summary: str = ""
    attempts: list[Attempt] = Field(default_factory=list)
    usage: dict = Field(default_factory=dict)
    cost_usd: float | None = None
    subject: dict = Field(default_factory=dict)
    verdict_id: int | None = None

    def scores(self) -> dict[str, float]:
        """``{"L1", "L2", "L3", "JS"}`` verified scores."""
        return {**{lvl: self.levels[lvl].score for lvl in LEVELS}, "JS": self.js}


class JudgeSummary(BaseModel):
    """Every sample's verdict and the median / spread per level and for JS."""

    records: list[JudgeRecord]
    stats: dict[str, SampleStats]


def _zero_levels(reason: str) -> dict[str, LevelResult]:
    return {lvl: LevelResult(raw_score=0.0, score=0.0, verified=True, rationale=reason) for lvl in LEVELS}


class _LazyBackend:
    """Creates the backend on first use (cached and ineligible verdicts need none)."""

    def __init__(self, cfg: JudgeConfig, backend=None):
        self.cfg, self.backend, self.owned = cfg, backend, False

    def get(self):
        if self.backend is None:
            self.backend = get_backend(self.cfg.backend, self.cfg.model, self.cfg.base_url, **self.cfg.options)
            self.owned = True
        return self.backend

    def close(self) -> None:
        if self.owned and self.backend is not None:
            self.backend.close()


def _price(usage, model: str) -> float | None:
    try:
        return price_turn(usage, model, load_prices())
    except (FileNotFoundError, ValueError, ImportError):
        return None


def _ask(backend, messages: list[dict], system: str, schema: dict, max_tokens: int) -> tuple[str, Any, Any, str]:
    """One model answer: ``(text, decoded JSON or None, usage, model)``; a reply that is not
    JSON comes back with ``None`` (a malformed verdict), provider failures raise JudgeError."""
    try:
        comp = backend.complete(messages, system=system, json_schema=schema, max_tokens=max_tokens)
    except MalformedOutputError as e:
        raw = e.raw if isinstance(e.raw, str) else json.dumps(e.raw, default=str) if e.raw is not None else ""
        return raw, None, Usage(), ""
    except BackendError as e:
        raise JudgeError(f"judge backend failed ({e.kind}): {e}") from None
    data = comp.parsed
    if data is None and comp.text:
        try:
            data = json.loads(comp.text)
        except json.JSONDecodeError:
            data = None
    return comp.text or (json.dumps(data) if data is not None else ""), data, comp.usage, comp.model


def _verify(kind: str, verdict, subject, props: dict[str, list[str]], context: dict) -> dict[str, LevelCheck]:
    out = {}
    for lvl in LEVELS:
        level = getattr(verdict, lvl)
        if kind == "impl":
            out[lvl] = verify_impl_level(lvl, level, props[lvl], context["files"])
        else:
            out[lvl] = verify_design_level(lvl, level, props[lvl], context["leaves"], context["criteria"])
    return out


def _level_result(level, check: LevelCheck, repaired: bool) -> LevelResult:
    return LevelResult(raw_score=level.score, score=verified_score(level.score, check.ok), verified=check.ok,
                       repaired=repaired, errors=check.errors, realised=level.realised, missing=level.missing,
                       rationale=level.rationale, evidence=[e.model_dump() for e in level.evidence],
                       located=check.located)


def _store(store, rec: JudgeRecord) -> JudgeRecord:
    if store is None:
        return rec
    s = rec.scores()
    rec.verdict_id = store.add_verdict(
        kind=rec.kind, task=rec.task, target=rec.target, model=rec.judge["model"], backend=rec.judge["backend"],
        prompt_version=rec.judge["prompt_version"], rubric_version=rec.judge["rubric_version"],
        input_hash=rec.input_hash, l1=s["L1"], l2=s["L2"], l3=s["L3"], js=s["JS"],
        verdict=rec.model_dump(mode="json", exclude={"verdict_id", "cached"}), sample=rec.sample, status=rec.status)
    return rec


def _from_cache(store, digest: str, target: str, subject_meta: dict) -> JudgeRecord | None:
    if store is None:
        return None
    row = find_cached(store, digest, target) or find_cached(store, digest)
    if row is None:
        return None
    rec = JudgeRecord.model_validate_json(row["verdict_json"])
    rec.cached, rec.verdict_id = True, row["id"]
    if row["target"] != target:  # the same inputs judged for another target (e.g. two runs, one candidate)
        rec.target, rec.subject = target, subject_meta
        _store(store, rec)
        rec.cached = True
    return rec


def judge(subject: ImplSubject | DesignSubject, cfg: JudgeConfig, *, store=None, backend=None, sample: int = 0,
          progress: Callable[[str], None] | None = None) -> JudgeRecord:
    """Assess ``subject`` once (sample index ``sample``) and record the verdict.

    Args:
        subject: from :mod:`d2kbench.judge.targets`.
        cfg: the judge configuration.
        store: a :class:`d2kbench.store.Store` (the cache and the record), or None.
        backend: an already constructed backend (default: ``get_backend`` from ``cfg``).
        sample: the sample index (part of the cache key: samples are independent answers).
        progress: called with short status lines.

    Returns:
        The :class:`JudgeRecord` (``cached=True`` when it came from the store).

    Raises:
        JudgeError: provider failure, or no valid verdict after the repair round.
        d2kbench.judge.targets.TargetError: the task lacks an expert solution.
    """
    lazy = _LazyBackend(cfg, backend)
    try:
        return _judge(subject, cfg, store, lazy, sample, progress or (lambda _m: None))
    finally:
        lazy.close()


def _judge(subject, cfg: JudgeConfig, store, lazy: _LazyBackend, sample: int, say) -> JudgeRecord:
    """One verdict on ``subject`` (sample ``sample``): the cached one for the same inputs, a
    zero verdict without a model call when there is nothing to judge, else the model's answer
    verified (with one repair round when ``cfg.repair`` and the first answer had problems).

    Raises:
        JudgeError: no valid verdict after the repair round.
    """
    task = subject.task
    if store is not None:
        store.add_secrets(secret_values(cfg.options))  # a judge's API key never reaches a verdict
    kind = "impl" if isinstance(subject, ImplSubject) else "design"
    rubric_file = (task.root / "rubric.yaml").read_text()
    judge_info = {"backend": cfg.backend, "model": cfg.model, "base_url": redact_url(cfg.base_url or "") or None,
                  "rubric_version": task.rubric.version, "rubric_sha256": sha256_text(rubric_file),
                  "verifier_version": VERIFIER_VERSION}
    runnable = subject.eligible if kind == "impl" else subject.design is not None
    if not runnable:
        return _unjudged(subject, cfg, store, kind, judge_info, sample, say)
    prompt, context = _prompt_and_context(kind, subject)
    judge_info["prompt_version"] = prompt.version
    schema = provider_schema(VERDICT_MODELS[kind], strict=True)
    digest = input_hash({"kind": kind, "prompt": prompt.fingerprint(), "rubric_version": task.rubric.version,
                         "rubric_sha256": judge_info["rubric_sha256"], "verifier": VERIFIER_VERSION,
                         "schema": schema, "judge": cfg.key(), "sample": sample})
    cached = _from_cache(store, digest, subject.target, subject.meta)
    if cached:
        say(f"{subject.target}: cached verdict {cached.verdict_id} (input hash {digest[:12]})")
        return cached
    final_levels, summary, attempts, usages = _ask_and_verify(subject, cfg, lazy, kind, prompt, schema, context, say)
    total = Usage.total(usages)
    rec = JudgeRecord(kind=kind, task=task.id, target=subject.target, status="judged", reason=subject.reason,
                      judge=judge_info, input_hash=digest, sample=sample, levels=final_levels,
                      js=judge_score({lvl: final_levels[lvl].score for lvl in LEVELS}), summary=summary,
                      attempts=attempts, usage=total.model_dump(), cost_usd=_price(total, cfg.model),
                      subject=subject.meta)
    return _store(store, rec)


def _unjudged(subject, cfg: JudgeConfig, store, kind: str, judge_info: dict, sample: int, say) -> JudgeRecord:
    """The verdict of a subject with nothing to judge (an ineligible implementation, a design run
    without a design): every level scores 0, no model call; cached like any verdict."""
    status = "ineligible" if kind == "impl" else "no_design"
    judge_info["prompt_version"] = "none"
    digest = input_hash({"kind": kind, "status": status, "target": subject.target, "reason": subject.reason,
                         "judge": cfg.key(), "sample": sample})
    cached = _from_cache(store, digest, subject.target, subject.meta)
    if cached:
        return cached
    say(f"{subject.target}: {status} ({subject.reason}): every level scores 0, no model call")
    rec = JudgeRecord(kind=kind, task=subject.task.id, target=subject.target, status=status, reason=subject.reason,
                      judge=judge_info, input_hash=digest, sample=sample, levels=_zero_levels(subject.reason),
                      js=0.0, subject=subject.meta)
    return _store(store, rec)


def _prompt_and_context(kind: str, subject) -> tuple[JudgePrompt, dict]:
    """The judge's prompt for ``subject`` and the context its evidence is verified against: the
    candidate's file (``impl``), or the design's leaves and the texts of the criteria (``design``)."""
    task = subject.task
    if kind == "impl":
        prompt: JudgePrompt = impl_prompt(task, subject.candidate, expert_source(task))
        context: dict = {"files": {subject.candidate.name: subject.candidate}}
    else:
        prompt = design_prompt(task, subject.design)
        context = {"leaves": design_leaves(subject.design),
                   "criteria": {**criteria_texts(task.guidance, task.rubric),
                                "task description": task.spec.description}}
    return prompt, context


def _ask_and_verify(subject, cfg: JudgeConfig, lazy: _LazyBackend, kind: str, prompt: JudgePrompt, schema: dict,
                    context: dict, say) -> tuple[dict[str, LevelResult], str, list[Attempt], list[Usage]]:
    """Ask the judge model, parse and verify its verdict; when ``cfg.repair`` and the first
    answer had problems, ask once more with them and take the repaired levels where the first
    answer's failed. Returns ``(levels, summary, attempts, usages)``.

    Raises:
        JudgeError: no valid verdict after the repair round.
    """
    props = rubric_properties(subject.task.rubric)
    backend = lazy.get()
    messages = prompt.messages()
    attempts: list[Attempt] = []
    usages = []

    def one(msgs: list[dict]):
        say(f"{subject.target}: asking {cfg.backend}:{cfg.model} ({kind} judge)")
        text, data, usage, model = _ask(backend, msgs, prompt.system, schema, cfg.max_tokens)
        usages.append(usage)
        att = Attempt(text=text, usage=usage.model_dump(), model=model)
        attempts.append(att)
        try:
            verdict = parse_verdict(kind, data if data is not None else text)
        except MalformedVerdict as e:
            att.problems = e.problems
            return None, None
        checks = _verify(kind, verdict, subject, props, context)
        att.problems = [err for c in checks.values() for err in c.errors]
        return verdict, checks

    v1, c1 = one(messages)
    final_levels: dict[str, LevelResult] = {}
    summary = ""
    if v1 is not None:
        final_levels = {lvl: _level_result(getattr(v1, lvl), c1[lvl], False) for lvl in LEVELS}
        summary = v1.summary
    if cfg.repair and attempts[0].problems:
        msgs = messages + [{"role": "assistant", "content": attempts[0].text or "(no answer)"},
                           {"role": "user", "content": repair_message(prompt, attempts[0].problems)}]
        v2, c2 = one(msgs)
        if v2 is not None:
            for lvl in LEVELS:
                if v1 is None or not c1[lvl].ok:
                    final_levels[lvl] = _level_result(getattr(v2, lvl), c2[lvl], True)
            summary = summary or v2.summary
    if not final_levels:
        problems = "; ".join(attempts[-1].problems) or "no answer"
        raise JudgeError(f"the judge ({cfg.backend}:{cfg.model}) gave no valid {kind} verdict"
                         f"{' after the repair round' if len(attempts) > 1 else ''}: {problems}")
    return final_levels, summary, attempts, usages


def judge_samples(subject: ImplSubject | DesignSubject, cfg: JudgeConfig, samples: int = 1, *, store=None,
                  backend=None, progress: Callable[[str], None] | None = None) -> JudgeSummary:
    """Assess ``subject`` ``samples`` times (independent answers, each cached and recorded)
    and report the median and spread per level and for JS.

    Raises:
        ValueError: ``samples`` < 1.
        JudgeError: as :func:`judge`.
    """
    if samples < 1:
        raise ValueError(f"samples must be at least 1 (got {samples})")
    lazy = _LazyBackend(cfg, backend)
    try:
        records = [_judge(subject, cfg, store, lazy, k, progress or (lambda _m: None)) for k in range(samples)]
    finally:
        lazy.close()
    return JudgeSummary(records=records, stats=summarize([r.scores() for r in records]))
