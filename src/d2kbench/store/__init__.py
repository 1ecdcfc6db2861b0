"""SQLite results store: every evaluation record, written as it finishes."""

from d2kbench.store.db import DEFAULT_PATH, Store
from d2kbench.store.merge import MergeCounts

__all__ = ["DEFAULT_PATH", "MergeCounts", "Store"]
