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
        self._add_columns()
        self.conn.commit()

    #: Columns added to the agent tables after their first release (table, column, declaration),
    #: added to older store files on open.
    _ADDED_COLUMNS = (
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
    )

    def _add_columns(self) -> None:
        for table, column, decl in self._ADDED_COLUMNS:
            have = {r[1] for r in self.conn.execute(f"PRAGMA table_info({table})")}
            if column not in have:
                try:
                    self.conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
                except sqlite3.OperationalError as e:  # another process added it first
                    if "duplicate column" not in str(e):
                        raise

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

    def merge_evaluations(self, other: str | Path, task: str | None = None) -> int:
        """Append the evaluation records of another store file (e.g. one written on a GPU
        machine) to this one; evaluations already present (same ``eval_id``) are skipped, so
        merging twice adds nothing. ``task``: only that task's evaluations. Returns the number
        of result rows added.

        Raises:
            FileNotFoundError: ``other`` does not exist; sqlite3.DatabaseError: not a store.
        """
        if not Path(other).is_file():
            raise FileNotFoundError(f"no store at {other}")
        src = Store(other)  # opening upgrades an older file to this schema
        try:
            have = {r[0] for r in self.conn.execute("SELECT eval_id FROM evaluations")}
            new = [r for r in src.conn.execute("SELECT * FROM evaluations ORDER BY created_at")
                   if r["eval_id"] not in have and (task is None or r["task"] == task)]
            added = 0
            with self.conn:
                for ev in new:
                    self.conn.execute("INSERT INTO evaluations(eval_id, task, device, created_at, env_json) "
                                      "VALUES (?,?,?,?,?)", tuple(ev[k] for k in ("eval_id", "task", "device",
                                                                                  "created_at", "env_json")))
                    cols = ("eval_id", "task", "solution", "solution_sha256", "role", "workload", "device", "status",
                            "cause", "mean_ms", "median_ms", "recorded_at", "record_json")
                    for r in src.conn.execute("SELECT * FROM results WHERE eval_id = ? ORDER BY id", (ev["eval_id"],)):
                        self.conn.execute(f"INSERT INTO results({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                                          tuple(r[c] for c in cols))
                        added += 1
            return added
        finally:
            src.close()

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

    # Queries for scores and reports (d2kbench.report). A list filter matches any of its values;
    # None means no filter.
    def _select(self, table: str, filters: dict[str, list | None], order: str) -> list[sqlite3.Row]:
        q, params = f"SELECT * FROM {table} WHERE 1=1", []
        for column, values in filters.items():
            if values is not None:
                q += f" AND {column} IN (SELECT value FROM json_each(?))"
                params.append(json.dumps(list(values)))
        return list(self.conn.execute(q + f" ORDER BY {order}", params))

    def run_rows(self, campaigns: list[str] | None = None, tasks: list[str] | None = None,
                 models: list[str] | None = None, guidance: list[str] | None = None,
                 seeds: list[int] | None = None, run_ids: list[str] | None = None) -> list[sqlite3.Row]:
        """Agent runs matching the filters, by (task, model, guidance, run_id)."""
        return self._select("runs", {"campaign": campaigns, "task": tasks, "model": models, "guidance": guidance,
                                     "seed": seeds, "run_id": run_ids}, "task, model, guidance, run_id")

    def candidate_rows(self, run_ids: list[str]) -> list[sqlite3.Row]:
        """Candidates of these runs, by (run_id, turn, id)."""
        return self._select("candidates", {"run_id": run_ids}, "run_id, turn, id")

    def eval_rows(self, eval_ids: list[str]) -> list[sqlite3.Row]:
        """Result rows of these evaluations, by id."""
        return self._select("results", {"eval_id": eval_ids}, "id")

    def solution_rows(self, solutions: list[str], tasks: list[str] | None = None) -> list[sqlite3.Row]:
        """Result rows of solutions by name (e.g. ``reference``, ``expert``), by id."""
        return self._select("results", {"solution": solutions, "task": tasks}, "id")

    def evaluation_envs(self) -> dict[str, dict]:
        """eval_id -> the environment record of every evaluation."""
        return {r["eval_id"]: json.loads(r["env_json"]) for r in self.conn.execute("SELECT * FROM evaluations")}

    def turn_rows(self, run_ids: list[str]) -> list[sqlite3.Row]:
        """Per-turn token usage of these runs, by (run_id, turn)."""
        return self._select("turns", {"run_id": run_ids}, "run_id, turn")

    def verdict_rows(self, tasks: list[str] | None = None) -> list[sqlite3.Row]:
        """Judge verdicts of these tasks, by id."""
        return self._select("verdicts", {"task": tasks}, "id")

    # ---- judge verdicts (d2kbench.judge) ---------------------------------------------------
    def add_verdict(self, *, kind: str, task: str, target: str, model: str, backend: str, prompt_version: str,
                    rubric_version: str, input_hash: str, l1: float, l2: float, l3: float, js: float,
                    verdict: dict, sample: int = 0, status: str = "judged") -> int:
        """Record one judge verdict (scores after verification); returns its id."""
        with self.conn:
            cur = self.conn.execute(
                "INSERT INTO verdicts(kind, task, target, model, prompt_version, rubric_version, input_hash, l1, l2,"
                " l3, js, verdict_json, created_at, backend, sample, status) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (kind, task, target, model, prompt_version, rubric_version, input_hash, l1, l2, l3, js,
                 json.dumps(verdict, default=str), _now(), backend, sample, status))
        return int(cur.lastrowid)

    def verdicts_by_hash(self, input_hash: str) -> list[sqlite3.Row]:
        """Verdicts recorded under one input hash, oldest first."""
        return list(self.conn.execute("SELECT * FROM verdicts WHERE input_hash=? ORDER BY id", (input_hash,)))

    def runs_with_prefix(self, prefix: str) -> list[sqlite3.Row]:
        """Runs whose id starts with ``prefix`` (taken literally), by id."""
        return list(self.conn.execute("SELECT * FROM runs WHERE substr(run_id, 1, ?) = ? ORDER BY run_id",
                                      (len(prefix), prefix)))

    # ---- agent runs (d2kbench.agents, d2kbench.campaign) ------------------------------------
    def start_run(self, run_id: str, *, task: str, model: str, backend: str, guidance: str, seed: int,
                  budget_turns: int, config: dict, campaign: str | None = None, run_key: str | None = None,
                  attempt: int = 1) -> None:
        """Insert a run with status ``running`` (replacing nothing: ``run_id`` must be new).

        Raises:
            sqlite3.IntegrityError: ``run_id`` exists already.
        """
        with self.conn:
            self.conn.execute(
                "INSERT INTO runs(run_id, campaign, task, model, backend, guidance, seed, budget_turns, status,"
                " started_at, config_json, run_key, attempt) VALUES (?,?,?,?,?,?,?,?,'running',?,?,?,?)",
                (run_id, campaign, task, model, backend, guidance, seed, budget_turns, _now(),
                 json.dumps(config, default=str), run_key or run_id, attempt))

    def finish_run(self, run_id: str, *, status: str, final_candidate: int | None = None,
                   exit_reason: str | None = None, error: str | None = None, cost_usd: float | None = None,
                   cli_cost_usd: float | None = None, summary: dict | None = None) -> bool:
        """Close a run: status ``finished``, ``failed`` or ``interrupted``, its final candidate and summary.

        Only a run still ``running`` is closed. A worker that outlived a killed campaign and
        finishes after the resume marked its attempt ``interrupted`` (and started the next one)
        changes nothing, so a run is never counted finished twice. Returns whether it closed.
        """
        with self.conn:
            cur = self.conn.execute(
                "UPDATE runs SET status=?, finished_at=?, final_candidate=?, exit_reason=?, error=?, cost_usd=?,"
                " cli_cost_usd=?, summary_json=? WHERE run_id=? AND status='running'",
                (status, _now(), final_candidate, exit_reason, error, cost_usd, cli_cost_usd,
                 json.dumps(summary or {}, default=str), run_id))
        return cur.rowcount == 1

    def mark_interrupted(self, run_ids: list[str], reason: str) -> None:
        """Set runs left ``running`` by a dead process to ``interrupted`` (their rows stay)."""
        with self.conn:
            self.conn.executemany("UPDATE runs SET status='interrupted', finished_at=?, error=? "
                                  "WHERE run_id=? AND status='running'", [(_now(), reason, r) for r in run_ids])

    def add_turn(self, run_id: str, turn: int, *, input_tokens: int, output_tokens: int, cache_read: int,
                 cache_write_5m: int, cache_write_1h: int, cost_usd: float, cli_cost_usd: float | None = None,
                 model: str | None = None, reasoning_tokens: int = 0, retries: int = 0) -> None:
        """Write (or rewrite) the usage and cost of one turn (one model response; 1-based)."""
        with self.conn:
            self.conn.execute(
                "INSERT OR REPLACE INTO turns(run_id, turn, input_tokens, output_tokens, cache_read, cache_write_5m,"
                " cache_write_1h, cost_usd, cli_cost_usd, created_at, model, reasoning_tokens, retries)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (run_id, turn, input_tokens, output_tokens, cache_read, cache_write_5m, cache_write_1h, cost_usd,
                 cli_cost_usd, _now(), model, reasoning_tokens, retries))

    def add_event(self, run_id: str, turn: int, kind: str, data: dict) -> int:
        """Append one trajectory event; returns its sequence number (1-based, per run). Safe
        across processes (the next number is taken inside a write transaction)."""
        with self.conn:
            self.conn.execute("BEGIN IMMEDIATE")
            seq = self.conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE run_id=?",
                                    (run_id,)).fetchone()[0]
            self.conn.execute("INSERT INTO events(run_id, seq, turn, kind, data_json) VALUES (?,?,?,?,?)",
                              (run_id, seq, turn, kind, json.dumps(data, default=str)))
        return int(seq)

    def add_candidate(self, run_id: str, *, turn: int, solution_sha256: str, path: str, eval_id: str | None,
                      eligible: bool, geomean_speedup: float | None, status: str = "evaluated",
                      note: str | None = None) -> int:
        """Record one submission of a run and its evaluation; returns the candidate id."""
        with self.conn:
            cur = self.conn.execute(
                "INSERT INTO candidates(run_id, turn, solution_sha256, path, eval_id, eligible, geomean_speedup,"
                " created_at, status, note) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (run_id, turn, solution_sha256, path, eval_id, int(eligible), geomean_speedup, _now(), status, note))
        return int(cur.lastrowid)

    def run(self, run_id: str) -> sqlite3.Row | None:
        """One run's row."""
        return self.conn.execute("SELECT * FROM runs WHERE run_id=?", (run_id,)).fetchone()

    def runs_of(self, *, campaign: str | None = None, run_key: str | None = None) -> list[sqlite3.Row]:
        """Runs of a campaign and/or of one planned run key, oldest first."""
        q, params = "SELECT * FROM runs WHERE 1=1", []
        if campaign is not None:
            q += " AND campaign=?"
            params.append(campaign)
        if run_key is not None:
            q += " AND run_key=?"
            params.append(run_key)
        return list(self.conn.execute(q + " ORDER BY started_at, run_id", params))

    def candidates_of(self, run_id: str) -> list[sqlite3.Row]:
        """A run's candidates in submission order."""
        return list(self.conn.execute("SELECT * FROM candidates WHERE run_id=? ORDER BY id", (run_id,)))

    def turns_of(self, run_id: str) -> list[sqlite3.Row]:
        """A run's turns in order."""
        return list(self.conn.execute("SELECT * FROM turns WHERE run_id=? ORDER BY turn", (run_id,)))

    def events_of(self, run_id: str, kind: str | None = None) -> list[sqlite3.Row]:
        """A run's trajectory events in order, optionally of one kind."""
        q, params = "SELECT * FROM events WHERE run_id=?", [run_id]
        if kind:
            q += " AND kind=?"
            params.append(kind)
        return list(self.conn.execute(q + " ORDER BY seq", params))

    def close(self) -> None:
        self.conn.close()


def _now() -> str:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).isoformat(timespec="seconds")
