"""The results store: one SQLite file (default ``./d2k.sqlite``, or ``$D2K_STORE``).

Each workload result is one row, committed on its own (WAL journal), so a killed process
loses nothing already written. Rows keep the whole record as JSON, every timing sample
included; a few columns are copied out for queries.

An evaluation carries a status: ``running`` from its start, ``complete`` once every result is
written, ``interrupted`` when it stopped early (an exception, or its process is gone: see
:meth:`Store.evaluation_states`). Reports use complete evaluations only.

Secrets never reach the store: a run's configuration and a campaign plan pass through
:func:`d2kbench.store.redact.redact_secrets` before they are written, and every configuration,
event, error, summary, candidate note and verdict through :func:`d2kbench.store.redact.scrub`
with the secret values this store knows (:attr:`Store.secrets`: credential variables of the
environment, and what :meth:`Store.add_secrets` added, e.g. a run's API key).

:meth:`Store.merge` brings everything of another store file (evaluations, runs and their
attempts, candidates, turns, events, verdicts, plans) into this one, with ids remapped and
duplicates recognised by content, so merging the same store twice adds nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from pathlib import Path

from d2kbench.machine import host_id
from d2kbench.results import SolutionRun, WorkloadResult
from d2kbench.store.merge import Merge, MergeCounts
from d2kbench.store.redact import redact_secrets, scrub, secret_values
from d2kbench.store.schema import ADDED_COLUMNS, SCHEMA, inserted_id, now

DEFAULT_PATH = Path(os.environ.get("D2K_STORE", "d2k.sqlite"))

class Store:
    """Append-only store of evaluation records."""

    def __init__(self, path: str | Path = DEFAULT_PATH):
        self.path = Path(path)
        #: Secret values never written (:func:`d2kbench.store.redact.scrub`).
        self.secrets: set[str] = secret_values(environ=os.environ)
        self.conn = sqlite3.connect(self.path, timeout=30)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.executescript(SCHEMA)
        self._add_columns()
        self.conn.commit()

    def _add_columns(self) -> None:
        for table, column, decl in ADDED_COLUMNS:
            have = {r[1] for r in self.conn.execute(f"PRAGMA table_info({table})")}
            if column not in have:
                try:
                    self.conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
                except sqlite3.OperationalError as e:  # another process added it first
                    if "duplicate column" not in str(e):
                        raise

    def add_secrets(self, values) -> None:
        """Add secret values (an API key, a token) that no record of this store may contain;
        None and values too short to be told from ordinary text are ignored."""
        self.secrets |= secret_values({"secret": [v for v in values if isinstance(v, str)]})

    def _clean(self, obj):
        """``obj`` with this store's secret values and credentials in URLs redacted."""
        return scrub(obj, self.secrets)

    def start_evaluation(self, eval_id: str, task: str, device: str, env: dict, created_at: str) -> None:
        """Record the start of an evaluation (status ``running``, this process as its owner)."""
        with self.conn:
            self._insert_evaluation(eval_id, task, device, env, created_at)

    def _insert_evaluation(self, eval_id: str, task: str, device: str, env: dict, created_at: str) -> None:
        self.conn.execute(
            "INSERT OR IGNORE INTO evaluations(eval_id, task, device, created_at, env_json, status, host, pid)"
            " VALUES (?,?,?,?,?,'running',?,?)",
            (eval_id, task, device, created_at, json.dumps(env, default=str), host_id(), os.getpid()))

    def finish_evaluation(self, eval_id: str, status: str = "complete") -> None:
        """Close an evaluation: ``complete`` (every result written) or ``interrupted``.

        Raises:
            ValueError: another status.
        """
        if status not in ("complete", "interrupted"):
            raise ValueError(f"an evaluation finishes complete or interrupted, not {status!r}")
        with self.conn:
            self.conn.execute("UPDATE evaluations SET status=?, finished_at=? WHERE eval_id=? AND status='running'",
                              (status, now(), eval_id))

    def evaluation_states(self) -> dict[str, str]:
        """eval_id -> status of every evaluation, where a ``running`` evaluation whose process
        on this machine is gone reads ``interrupted`` (a process on another machine cannot be
        checked: it stays ``running`` until merged from the store that finished it)."""
        host = host_id()
        out = {}
        for r in self.conn.execute("SELECT eval_id, status, host, pid FROM evaluations"):
            status = r["status"]
            if status == "running" and r["host"] == host and isinstance(r["pid"], int) and not _alive(r["pid"]):
                status = "interrupted"
            out[r["eval_id"]] = status
        return out

    def record(self, eval_id: str, task: str, run: SolutionRun, result: WorkloadResult, device: str,
               env: dict, created_at: str) -> int:
        """Write one workload result (and its evaluation's header, ``running``, once); returns
        the row id. The evaluation stays ``running`` until :meth:`finish_evaluation`."""
        with self.conn:
            self._insert_evaluation(eval_id, task, device, env, created_at)
            cur = self.conn.execute(
                "INSERT INTO results(eval_id, task, solution, solution_sha256, role, workload, device, status,"
                " cause, mean_ms, median_ms, record_json) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (eval_id, task, run.solution, run.sha256, run.role, result.workload, device, result.status.value,
                 result.cause, result.timing.mean_ms if result.timing else None,
                 result.timing.median_ms if result.timing else None, result.model_dump_json()),
            )
        return inserted_id(cur)

    def merge(self, other: str | Path, task: str | None = None) -> MergeCounts:
        """Bring everything of another store file (e.g. one written on a GPU machine) into this
        one: evaluations and their results, runs with every attempt, candidates, turns, events,
        verdicts and campaign plans. ``task``: only that task's records.

        Duplicates are recognised by content: an evaluation by its id (a random id drawn at
        its start) and its records (a different evaluation under a taken id gets its own id),
        a run by its planned-run key, start time and identity, a candidate by (run, turn, source hash,
        evaluation, time), a verdict by everything it records; a turn or an event by its run
        and number. Ids are remapped: candidates get new ids (references in runs, events and
        verdicts follow), and a run whose id is taken here by a *different* run (the same
        planned run attempted on two machines) becomes the next attempt of its run key. A run
        this store has as ``running`` that the other store has settled takes the settled row.
        Merging the same store twice adds nothing.

        Raises:
            FileNotFoundError: ``other`` does not exist; sqlite3.DatabaseError: not a store;
            ValueError: ``other`` is this store's own file.
        """
        if not Path(other).is_file():
            raise FileNotFoundError(f"no store at {other}")
        if Path(other).resolve() == self.path.resolve():
            raise ValueError(f"cannot merge {other} into itself")
        src = Store(other)  # opening upgrades an older file to this schema
        try:
            with self.conn:
                return Merge(self.conn, src.conn, self.secrets, task).run()
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

    def evaluation_tasks(self) -> dict[str, str]:
        """eval_id -> the task of every evaluation."""
        return {r[0]: r[1] for r in self.conn.execute("SELECT eval_id, task FROM evaluations")}

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
                 json.dumps(self._clean(json.loads(json.dumps(verdict, default=str)))), now(), backend, sample,
                 status))
        return inserted_id(cur)

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
        ``config`` is recorded with its secrets redacted (:func:`redact_secrets`).

        Raises:
            sqlite3.IntegrityError: ``run_id`` exists already.
        """
        with self.conn:
            self.conn.execute(
                "INSERT INTO runs(run_id, campaign, task, model, backend, guidance, seed, budget_turns, status,"
                " started_at, config_json, run_key, attempt) VALUES (?,?,?,?,?,?,?,?,'running',?,?,?,?)",
                (run_id, campaign, task, model, backend, guidance, seed, budget_turns, now(),
                 json.dumps(self._clean(redact_secrets(json.loads(json.dumps(config, default=str))))),
                 run_key or run_id, attempt))

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
                (status, now(), final_candidate, exit_reason, self._clean(error), cost_usd, cli_cost_usd,
                 json.dumps(self._clean(json.loads(json.dumps(summary or {}, default=str)))), run_id))
        return cur.rowcount == 1

    def mark_interrupted(self, run_ids: list[str], reason: str) -> None:
        """Set runs left ``running`` by a dead process to ``interrupted`` (their rows stay)."""
        with self.conn:
            self.conn.executemany("UPDATE runs SET status='interrupted', finished_at=?, error=? "
                                  "WHERE run_id=? AND status='running'",
                                  [(now(), self._clean(reason), r) for r in run_ids])

    def add_turn(self, run_id: str, turn: int, *, input_tokens: int, output_tokens: int, cache_read: int,
                 cache_write_5m: int, cache_write_1h: int, cost_usd: float | None, cli_cost_usd: float | None = None,
                 model: str | None = None, reasoning_tokens: int = 0, retries: int = 0) -> None:
        """Write (or rewrite) the usage and cost of one turn (one model response; 1-based).
        ``cost_usd`` None: the model has no price, the turn's cost is unknown (``unpriced``)."""
        with self.conn:
            self.conn.execute(
                "INSERT OR REPLACE INTO turns(run_id, turn, input_tokens, output_tokens, cache_read, cache_write_5m,"
                " cache_write_1h, cost_usd, cli_cost_usd, created_at, model, reasoning_tokens, retries, unpriced)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (run_id, turn, input_tokens, output_tokens, cache_read, cache_write_5m, cache_write_1h,
                 0.0 if cost_usd is None else cost_usd, cli_cost_usd, now(), model, reasoning_tokens, retries,
                 int(cost_usd is None)))

    def add_event(self, run_id: str, turn: int, kind: str, data: dict) -> int:
        """Append one trajectory event; returns its sequence number (1-based, per run). Safe
        across processes (the next number is taken inside a write transaction)."""
        with self.conn:
            self.conn.execute("BEGIN IMMEDIATE")
            seq = self.conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE run_id=?",
                                    (run_id,)).fetchone()[0]
            self.conn.execute("INSERT INTO events(run_id, seq, turn, kind, data_json) VALUES (?,?,?,?,?)",
                              (run_id, seq, turn, kind,
                               json.dumps(self._clean(json.loads(json.dumps(data, default=str))))))
        return int(seq)

    def add_candidate(self, run_id: str, *, turn: int, solution_sha256: str, path: str, eval_id: str | None,
                      eligible: bool, geomean_speedup: float | None, status: str = "evaluated",
                      note: str | None = None) -> int:
        """Record one submission of a run and its evaluation; returns the candidate id."""
        with self.conn:
            cur = self.conn.execute(
                "INSERT INTO candidates(run_id, turn, solution_sha256, path, eval_id, eligible, geomean_speedup,"
                " created_at, status, note) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (run_id, turn, solution_sha256, path, eval_id, int(eligible), geomean_speedup, now(), status,
                 self._clean(note)))
        return inserted_id(cur)

    def record_plan(self, name: str, plan: dict) -> bool:
        """Record a campaign plan (secrets redacted); returns whether this version is new."""
        clean = self._clean(redact_secrets(json.loads(json.dumps(plan, default=str))))
        text = json.dumps(clean, sort_keys=True)
        digest = hashlib.sha256(text.encode()).hexdigest()
        with self.conn:
            cur = self.conn.execute("INSERT OR IGNORE INTO campaigns(name, plan_sha256, plan_json, recorded_at) "
                                    "VALUES (?,?,?,?)", (name, digest, text, now()))
        return cur.rowcount == 1

    def plans(self, names: list[str] | None = None) -> list[sqlite3.Row]:
        """Recorded campaign plans (every version), by (name, recorded_at)."""
        return self._select("campaigns", {"name": names}, "name, recorded_at, plan_sha256")

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
        """Close the connection (committed writes stay; the store can no longer be used)."""
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _alive(pid: int) -> bool:
    """Whether a process with this id exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
