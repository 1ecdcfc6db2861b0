"""Printing for the command-line layer: messages as plain text, never as rich markup."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text


def print_error(console: Console, message: object) -> None:
    """Print ``message`` in red as plain text.

    Never read as rich markup, so an index (``w13[0, 130, 98]``), a TOML table (``[tool.ruff]``)
    or a path with brackets is printed as written instead of vanishing or raising rich's
    ``MarkupError``; never hard-wrapped, so a path or a value stays on one line whatever the
    terminal's width."""
    console.print(Text(str(message), style="red"), soft_wrap=True)
