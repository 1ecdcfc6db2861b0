#!/usr/bin/env bash
# Install the agent CLIs that tests/test_agents_cli.py drives against the fake provider:
# Claude Code and Codex, pinned, from the npm registry (each ships its native binary as an
# npm package; nothing else is downloaded). Idempotent: pinned versions already on PATH are
# kept. Usage (CI does this from .ci/run):  bash .ci/install-agent-clis.sh
set -euo pipefail

CLAUDE_CODE_VERSION="2.1.332"   # @anthropic-ai/claude-code
CODEX_VERSION="0.171.0"         # @openai/codex

have() {  # have BINARY VERSION: the binary is on PATH and reports VERSION
  command -v "$1" >/dev/null 2>&1 && "$1" --version 2>/dev/null | grep -qF "$2"
}

if ! command -v npm >/dev/null 2>&1; then
  echo "install-agent-clis: npm not found; install Node.js (>= 20) first" >&2
  exit 1
fi

pkgs=()
have claude "$CLAUDE_CODE_VERSION" || pkgs+=("@anthropic-ai/claude-code@${CLAUDE_CODE_VERSION}")
have codex "$CODEX_VERSION" || pkgs+=("@openai/codex@${CODEX_VERSION}")
if [ "${#pkgs[@]}" -gt 0 ]; then
  echo "install-agent-clis: npm install -g ${pkgs[*]}"
  # the claude package's postinstall only links its platform binary; allow it where npm asks
  npm install -g --no-fund --no-audit --allow-scripts=@anthropic-ai/claude-code "${pkgs[@]}"
fi

have claude "$CLAUDE_CODE_VERSION" || { echo "install-agent-clis: claude $CLAUDE_CODE_VERSION not usable" >&2; exit 1; }
have codex "$CODEX_VERSION" || { echo "install-agent-clis: codex $CODEX_VERSION not usable" >&2; exit 1; }
echo "install-agent-clis: $(claude --version); $(codex --version)"
