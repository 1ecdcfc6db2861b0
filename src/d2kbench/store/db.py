"""The results store: one SQLite file (default ``./d2k.sqlite``, or ``$D2K_STORE``).

Each workload result is one row, committed on its own (WAL journal), so a killed process
loses nothing already written. Rows keep the whole record as JSON, every timing sample
included; a few columns are copied out for queries.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

from d2kbench.harness.results import SolutionRun, WorkloadResult

DEFAULT_PATH = Path(os.environ.get("D2K_STORE", "d2k.sqlite"))

_SCHEMA = """
CREATE TABLE IF NOT EXISTS evaluations (
    eval_id    TEXT PRIMARY KEY,
    task       TEXT NOT NULL,
    device     TEXT NOT NULL,
    created_at TEXT NOT NULL,
    env_json   TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS results (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    eval_id         TEXT NOT NULL REFERENCES evaluations(eval_id),
    task            TEXT NOT NULL,
    solution        TEXT NOT NULL,
    solution_sha256 TEXT NOT NULL,
    role            TEXT NOT NULL,
    workload        TEXT NOT NULL,
    device          TEXT NOT NULL,
    status          TEXT NOT NULL,
    cause           TEXT NOT NULL,
    mean_ms         REAL,
    median_ms       REAL,
    recorded_at     TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ', 'now')),
    record_json     TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS results_task ON results(task, workload);
CREATE INDEX IF NOT EXISTS results_sha ON results(solution_sha256);
"""


class Store:
    """Append-only store of evaluation records."""

    def __init__(self, path: str | Path = DEFAULT_PATH):
        self.path = Path(path)
        self.conn = sqlite3.connect(self.path, timeout=30)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.executescript(_SCHEMA)
        self.conn.commit()

    def record(self, eval_id: str, task: str, run: SolutionRun, result: WorkloadResult, device: str,
               env: dict, created_at: str) -> int:
        """Write one workload result (and its evaluation's header, once); returns the row id."""
        with self.conn:
            self.conn.execute(
                "INSERT OR IGNORE INTO evaluations(eval_id, task, device, created_at, env_json) VALUES (?,?,?,?,?)",
                (eval_id, task, device, created_at, json.dumps(env, default=str)),
            )
            cur = self.conn.execute(
                "INSERT INTO results(eval_id, task, solution, solution_sha256, role, workload, device, status,"
                " cause, mean_ms, median_ms, record_json) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (eval_id, task, run.solution, run.sha256, run.role, result.workload, device, result.status.value,
                 result.cause, result.timing.mean_ms if result.timing else None,
                 result.timing.median_ms if result.timing else None, result.model_dump_json()),
            )
        return int(cur.lastrowid)

    def rows(self, task: str | None = None, solution: str | None = None, limit: int | None = None) -> list[sqlite3.Row]:
        """Result rows, newest first, optionally filtered by task and solution name or hash prefix."""
        q, params = "SELECT * FROM results WHERE 1=1", []
        if task:
            q += " AND task = ?"
            params.append(task)
        if solution:
            q += " AND (solution = ? OR solution_sha256 LIKE ?)"
            params += [solution, solution + "%"]
        q += " ORDER BY id DESC"
        if limit:
            q += f" LIMIT {int(limit)}"
        return list(self.conn.execute(q, params))

    def result(self, row: sqlite3.Row) -> WorkloadResult:
        """The full record of a row."""
        return WorkloadResult.model_validate_json(row["record_json"])

    def env(self, eval_id: str) -> dict:
        row = self.conn.execute("SELECT env_json FROM evaluations WHERE eval_id = ?", (eval_id,)).fetchone()
        return json.loads(row["env_json"]) if row else {}

    def close(self) -> None:
        self.conn.close()
