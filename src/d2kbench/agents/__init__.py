"""Agent runs (SPEC.md section 4, DESIGN.md section 6).

* :mod:`d2kbench.agents.backends`: one interface over model providers and agent CLIs
  (``openai``, ``anthropic``, ``claude-code``, ``codex``); :func:`get_backend`.
* :mod:`d2kbench.agents.fake_provider`: an offline provider server for tests.
* :mod:`d2kbench.agents.workspace`: guided / unguided workspaces.
* :mod:`d2kbench.agents.tools`: the test, bench, profile and submit tools.
* :mod:`d2kbench.agents.runner`: one run (task, model, backend, guidance), recorded in the store.

Importing this package has no side effects and imports no provider SDK.
"""
