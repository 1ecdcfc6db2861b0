"""The LLM judge and independent design runs (docs/protocol.md, "Runs" and "Judge").

Runtime alone cannot say whether a gap to the expert is a design or an implementation
failure; the judge scores, per level (L1 algorithm, L2 dataflow, L3 mechanisms), how far a
candidate's *code* or an agent's *design* realises the task's rubric, and every score must
be backed by evidence that this package verifies mechanically.

Modules (one job each):

* :mod:`~d2kbench.judge.verdict`: the judge's output contract (pydantic; JSON Schema export).
* :mod:`~d2kbench.judge.design_schema`: ``model_design.json`` of independent design runs.
* :mod:`~d2kbench.judge.jsonschemas`: provider-ready and published JSON Schemas.
* :mod:`~d2kbench.judge.sourcelines`: numbered listings and executable-line detection.
* :mod:`~d2kbench.judge.evidence`: verification of line citations and design quotes.
* :mod:`~d2kbench.judge.scoring`: verified level scores, JS, sample statistics.
* :mod:`~d2kbench.judge.prompts`: the versioned prompt files and the judge inputs.
* :mod:`~d2kbench.judge.cache`: the input hash and cached verdicts in the store.
* :mod:`~d2kbench.judge.targets`: what is judged (a run's final candidate, a solution, a design).
* :mod:`~d2kbench.judge.runner`: one judge call with verification, a repair round and storage.
* :mod:`~d2kbench.judge.design_run`: ``d2k design``: an agent proposes a design, no code.
* :mod:`~d2kbench.judge.commands`: the ``d2k judge`` and ``d2k design`` commands.

Importing this package has no side effects and imports no provider SDK.
"""
