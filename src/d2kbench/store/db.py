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
-- Agent runs (SPEC.md section 4): one row per (task, model, backend, guidance, seed) run.
CREATE TABLE IF NOT EXISTS runs (
    run_id       TEXT PRIMARY KEY,
    campaign     TEXT,
    task         TEXT NOT NULL,
    model        TEXT NOT NULL,
    backend      TEXT NOT NULL,
    guidance     TEXT NOT NULL,          -- none | L1 | L1+L2 | L1+L2+L3 | design
    seed         INTEGER NOT NULL DEFAULT 0,
    budget_turns INTEGER NOT NULL,
    status       TEXT NOT NULL,          -- running | finished | failed
    started_at   TEXT NOT NULL,
    finished_at  TEXT,
    final_candidate INTEGER,             -- candidates.id of the selected final answer
    config_json  TEXT NOT NULL DEFAULT '{}'
);
-- Every submission of a run, snapshotted and evaluated by the harness.
CREATE TABLE IF NOT EXISTS candidates (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id          TEXT NOT NULL REFERENCES runs(run_id),
    turn            INTEGER NOT NULL,
    solution_sha256 TEXT NOT NULL,
    path            TEXT NOT NULL,
    eval_id         TEXT,                -- evaluations.eval_id
    eligible        INTEGER NOT NULL,    -- 1 when every workload passed every check
    geomean_speedup REAL,
    created_at      TEXT NOT NULL
);
-- Token usage and cost per turn (one model response).
CREATE TABLE IF NOT EXISTS turns (
    run_id          TEXT NOT NULL REFERENCES runs(run_id),
    turn            INTEGER NOT NULL,
    input_tokens    INTEGER NOT NULL DEFAULT 0,
    output_tokens   INTEGER NOT NULL DEFAULT 0,
    cache_read      INTEGER NOT NULL DEFAULT 0,
    cache_write_5m  INTEGER NOT NULL DEFAULT 0,
    cache_write_1h  INTEGER NOT NULL DEFAULT 0,
    cost_usd        REAL NOT NULL DEFAULT 0,
    cli_cost_usd    REAL,                -- the CLI's own cost figure, where it reports one
    created_at      TEXT NOT NULL,
    PRIMARY KEY (run_id, turn)
);
-- The trajectory: messages, tool calls and candidate events, in order.
CREATE TABLE IF NOT EXISTS events (
    run_id    TEXT NOT NULL REFERENCES runs(run_id),
    seq       INTEGER NOT NULL,
    turn      INTEGER NOT NULL,
    kind      TEXT NOT NULL,             -- message | tool_call | tool_result | candidate | error
    data_json TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
-- LLM-judge verdicts (SPEC.md section 5).
CREATE TABLE IF NOT EXISTS verdicts (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    kind           TEXT NOT NULL,        -- impl | design
    task           TEXT NOT NULL,
    target         TEXT NOT NULL,        -- run_id, solution sha256 or design sha256
    model          TEXT NOT NULL,
    prompt_version TEXT NOT NULL,
    rubric_version TEXT NOT NULL,
    input_hash     TEXT NOT NULL,
    l1 REAL NOT NULL, l2 REAL NOT NULL, l3 REAL NOT NULL,
    js             REAL NOT NULL,
    verdict_json   TEXT NOT NULL,
    created_at     TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS verdicts_hash ON verdicts(input_hash);
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
