"""The versioned prompt files (``judge/prompts/*.md``) and the judge's inputs.

Each prompt file starts with a YAML front matter (``id``, ``version``) followed by a
:class:`string.Template` body (``${name}`` placeholders; code braces need no escaping). A
verdict records the versions of the files it used (``judge_system@1+judge_impl@1+...``) and
the cache key also covers the files' text, so an edit without a version bump still
invalidates cached verdicts.

Inputs (docs/protocol.md, "Judge"), never runtime:

* implementation: the guidance (all levels), the rubric with its judge notes (the property ids
  the verdict must use), the expert source (unnumbered, not citable) and the candidate source
  with line numbers;
* design: the task's description, the rubric with its judge notes, and the design, one field
  per line with its JSON pointer.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from string import Template

import yaml

from d2kbench.judge.design_schema import design_leaves
from d2kbench.judge.evidence import MAX_EVIDENCE, MAX_SPAN, MIN_QUOTE_CHARS
from d2kbench.judge.sourcelines import SourceFile
from d2kbench.judge.verdict import LEVELS
from d2kbench.tasks.schema import Guidance, Rubric

PROMPT_DIR = Path(__file__).resolve().parent / "prompts"


class PromptFileError(ValueError):
    """A prompt file is missing, has no valid front matter, or a placeholder is unfilled."""


@dataclass(frozen=True)
class PromptFile:
    """One prompt file: ``id``, ``version`` and its template body."""

    id: str
    version: str
    body: str

    @property
    def tag(self) -> str:
        return f"{self.id}@{self.version}"

    def render(self, **values) -> str:
        """The body with every ``${name}`` replaced.

        Raises:
            PromptFileError: a placeholder has no value.
        """
        try:
            return Template(self.body).substitute(values)
        except KeyError as e:
            raise PromptFileError(f"prompt {self.tag}: no value for placeholder {e}") from None


@lru_cache(maxsize=32)
def load_prompt(name: str, directory: str = str(PROMPT_DIR)) -> PromptFile:
    """Read ``<directory>/<name>.md``.

    Raises:
        PromptFileError: missing file, missing or malformed front matter, id not ``name``.
    """
    path = Path(directory) / f"{name}.md"
    if not path.is_file():
        raise PromptFileError(f"prompt file {path} not found")
    text = path.read_text()
    parts = text.split("---\n", 2)
    if not text.startswith("---\n") or len(parts) < 3:
        raise PromptFileError(f"{path}: must start with a '---' front matter holding id and version")
    try:
        head = yaml.safe_load(parts[1]) or {}
    except yaml.YAMLError as e:
        raise PromptFileError(f"{path}: front matter is not valid YAML: {e}") from None
    if head.get("id") != name or not str(head.get("version") or ""):
        raise PromptFileError(f"{path}: front matter needs id: {name} and a version")
    return PromptFile(id=name, version=str(head["version"]), body=parts[2].strip() + "\n")


def prompt_version(*prompts: PromptFile) -> str:
    """The version string recorded with a verdict: the tags of the files used, joined by ``+``."""
    return "+".join(p.tag for p in prompts)


# ---- rendering the inputs ---------------------------------------------------------------------

def render_guidance(guidance: Guidance) -> str:
    """All guidance items, grouped by level, as Markdown."""
    out = []
    for lvl in LEVELS:
        out.append(f"### {lvl}")
        for item in guidance.items:
            if item.level == lvl:
                deps = f" (builds on: {', '.join(item.depends_on)})" if item.depends_on else ""
                out.append(f"- **{item.title}** [`{item.id}`]{deps}: {item.text.strip()}")
        out.append("")
    return "\n".join(out).strip()


def render_rubric(rubric: Rubric) -> str:
    """Every level's properties (id, description, cost removed, partial adoption), accepted
    alternatives and judge notes, as Markdown."""
    out = []
    for lvl in LEVELS:
        level = getattr(rubric, lvl)
        out.append(f"### {lvl}: properties {', '.join(p.id for p in level.properties)}")
        for p in level.properties:
            line = f"- `{p.id}`: {p.description.strip()} Removes: {p.removes.strip()}"
            if p.partial:
                line += f" Partial adoption: {p.partial.strip()}"
            out.append(line)
        if level.accepted_alternatives:
            out.append("Accepted alternatives:")
            out += [f"- {a.strip()}" for a in level.accepted_alternatives]
        if level.judge_notes:
            out.append(f"Judge notes: {level.judge_notes.strip()}")
        out.append("")
    return "\n".join(out).strip()


def rubric_properties(rubric: Rubric) -> dict[str, list[str]]:
    """Property ids per level."""
    return {lvl: [p.id for p in getattr(rubric, lvl).properties] for lvl in LEVELS}


def render_design(design: dict) -> str:
    """The design as one ``/json/pointer: text`` line per text field (newlines inside a field
    shown as spaces), in document order."""
    return "\n".join(f"{ptr}: {' '.join(text.split())}" for ptr, text in design_leaves(design).items())


def criteria_texts(guidance: Guidance, rubric: Rubric) -> dict[str, str]:
    """The texts a design quote must not come from: the guidance and the rubric."""
    return {"guidance": render_guidance(guidance), "rubric": render_rubric(rubric)}


@dataclass(frozen=True)
class JudgePrompt:
    """A rendered judge request: system message, user message and the prompt version."""

    system: str
    user: str
    version: str
    repair: PromptFile

    def messages(self) -> list[dict]:
        return [{"role": "user", "content": self.user}]

    def fingerprint(self) -> dict:
        """What of the prompt enters the cache key: its texts (inputs included) and version."""
        return {"system": self.system, "user": self.user, "repair": self.repair.body, "version": self.version}


def impl_prompt(task, candidate: SourceFile, expert_source: str) -> JudgePrompt:
    """The implementation judge's request for ``candidate`` of ``task`` (a loaded task)."""
    system, user, repair = load_prompt("judge_system"), load_prompt("judge_impl"), load_prompt("judge_repair")
    text = user.render(task_id=task.id, task_title=task.spec.title, guidance=render_guidance(task.guidance),
                       rubric=render_rubric(task.rubric), expert_source=expert_source.rstrip("\n"),
                       candidate_name=candidate.name, candidate_listing=candidate.listing(),
                       n_lines=len(candidate.lines), max_evidence=MAX_EVIDENCE, max_span=MAX_SPAN)
    return JudgePrompt(system=system.render(), user=text, version=prompt_version(system, user, repair), repair=repair)


def design_prompt(task, design: dict) -> JudgePrompt:
    """The design judge's request for ``design`` (a decoded ``model_design.json``) of ``task``."""
    system, user, repair = load_prompt("judge_system"), load_prompt("judge_design"), load_prompt("judge_repair")
    text = user.render(task_id=task.id, task_title=task.spec.title, task_description=task.spec.description.strip(),
                       rubric=render_rubric(task.rubric), design_listing=render_design(design),
                       max_evidence=MAX_EVIDENCE, min_quote_chars=MIN_QUOTE_CHARS)
    return JudgePrompt(system=system.render(), user=text, version=prompt_version(system, user, repair), repair=repair)


def repair_message(prompt: JudgePrompt, problems: list[str]) -> str:
    """The repair round's user message listing the verification ``problems``."""
    return prompt.repair.render(problems="\n".join(f"- {p}" for p in problems))
