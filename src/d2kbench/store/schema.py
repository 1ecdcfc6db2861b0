"""The store's SQL: the tables of a store file (:data:`SCHEMA`) and small helpers shared by the
store (:mod:`d2kbench.store.db`) and its merge (:mod:`d2kbench.store.merge`).
"""

from __future__ import annotations

import sqlite3
from datetime import datetime, timezone

SCHEMA = """
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
-- Agent runs (docs/protocol.md, "Runs"): one row per (task, model, backend, guidance, seed) run.
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
-- LLM-judge verdicts (docs/protocol.md, "Judge").
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
-- Campaign plans (PLAN.yaml, secrets redacted): the declared tasks, models and guidance levels
-- of a campaign's scores. One row per (name, version of the plan).
CREATE TABLE IF NOT EXISTS campaigns (
    name        TEXT NOT NULL,
    plan_sha256 TEXT NOT NULL,
    plan_json   TEXT NOT NULL,
    recorded_at TEXT NOT NULL,
    PRIMARY KEY (name, plan_sha256)
);
CREATE INDEX IF NOT EXISTS results_sha ON results(solution_sha256);
"""


#: Columns added to the agent tables after their first release (table, column, declaration),
#: added to older store files on open.
ADDED_COLUMNS = (
    ("runs", "run_key", "TEXT"),                      # identity of the planned run (attempts share it)
    ("runs", "attempt", "INTEGER NOT NULL DEFAULT 1"),
    ("runs", "exit_reason", "TEXT"),                  # completed | budget | timeout | agent_error | ...
    ("runs", "error", "TEXT"),
    ("runs", "cost_usd", "REAL"),                     # sum of turns.cost_usd (our price table)
    ("runs", "cli_cost_usd", "REAL"),                 # the CLI's own total, where it reports one
    ("runs", "summary_json", "TEXT NOT NULL DEFAULT '{}'"),
    ("turns", "model", "TEXT"),
    ("turns", "reasoning_tokens", "INTEGER NOT NULL DEFAULT 0"),
    ("turns", "retries", "INTEGER NOT NULL DEFAULT 0"),  # failed attempts before this response
    ("candidates", "status", "TEXT NOT NULL DEFAULT 'evaluated'"),  # evaluated | rejected | error
    ("candidates", "note", "TEXT"),
    ("verdicts", "backend", "TEXT"),                  # judge backend (openai, anthropic, codex, ...)
    ("verdicts", "sample", "INTEGER NOT NULL DEFAULT 0"),  # sample index of repeated judging
    ("verdicts", "status", "TEXT NOT NULL DEFAULT 'judged'"),  # judged | ineligible | no_design
    # running | complete | interrupted; evaluations recorded before the status existed are
    # taken as complete (they cannot be told apart any more)
    ("evaluations", "status", "TEXT NOT NULL DEFAULT 'complete'"),
    ("evaluations", "finished_at", "TEXT"),
    ("evaluations", "host", "TEXT"),                  # the evaluating process, to detect a dead one
    ("evaluations", "pid", "INTEGER"),
    ("turns", "unpriced", "INTEGER NOT NULL DEFAULT 0"),  # 1: the model has no price, cost unknown
)


def inserted_id(cur: sqlite3.Cursor) -> int:
    """The row id of the row an INSERT just added."""
    if cur.lastrowid is None:
        raise sqlite3.DatabaseError("the INSERT added no row")
    return cur.lastrowid


def columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
