"""SQLite results store: every evaluation record, written as it finishes."""

from d2kbench.store.db import DEFAULT_PATH, Store

__all__ = ["DEFAULT_PATH", "Store"]
