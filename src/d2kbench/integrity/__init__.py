"""Reward-hacking defences: every known way to fake a fast or correct kernel is caught.

Layers (docs/integrity.md has the per-cheat table):

* :mod:`.static` - ``ast`` review of the solution source (parent);
* :mod:`.guard` with :mod:`.audit`, :mod:`.ops`, :mod:`.gpu` - monitors in the worker, installed
  before the solution is imported: audit hook, ATen dispatch monitor, Triton launch counter,
  identity snapshot, threads, profiler cross-checks;
* :mod:`.parent` - checks in the trusted parent: sensitivity call, outputs of timed calls, graph
  replays, roofline floor, harness file hashes;
* :mod:`.commands` - ``d2k evil`` (the evil-solution suite, run by :mod:`d2kbench.harness.evil`,
  which sits above the harness because it runs ``evaluate()``) and ``d2k lint``.

:mod:`.rules` names every rule and the catalogue entries it answers.
"""

from d2kbench.integrity.rules import RULES, Rule, rule

__all__ = ["RULES", "Rule", "rule"]
