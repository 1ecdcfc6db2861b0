"""Agent runs (docs/protocol.md, "Runs"; docs/architecture.md, "agents").

* :mod:`d2kbench.agents.backends`: one interface over model providers and agent CLIs
  (``openai``, ``anthropic``, ``claude-code``, ``codex``); :func:`get_backend`.
* :mod:`d2kbench.agents.workspace`: guided / unguided workspaces.
* :mod:`d2kbench.agents.tools`: the test, bench and profile tools; :mod:`d2kbench.agents.dispatch`:
  :func:`~d2kbench.agents.dispatch.run_tool`, the one entry point of all four tools (submit included).
* :mod:`d2kbench.agents.runner`: one run (task, model, backend, guidance), recorded in the store.

Importing this package has no side effects and imports no provider SDK.
"""
