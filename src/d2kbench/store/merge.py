"""Merging one store file into another (:meth:`d2kbench.store.db.Store.merge`): ids remapped,
duplicates recognised by content, so merging the same store twice adds nothing.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3

from pydantic import BaseModel

from d2kbench.store.redact import redact_secrets, scrub
from d2kbench.store.schema import columns, inserted_id


class MergeCounts(BaseModel):
    """What :meth:`Store.merge` added, per table; ``renamed_runs``: the other store's run id
    -> the id it has here, for runs that had to be renamed (a different run under a taken id);
    ``settled_runs``: runs this store had as ``running`` that took the other store's settled row."""

    evaluations: int = 0
    results: int = 0
    runs: int = 0
    candidates: int = 0
    turns: int = 0
    events: int = 0
    verdicts: int = 0
    plans: int = 0
    renamed_runs: dict[str, str] = {}
    settled_runs: list[str] = []

    def total(self) -> int:
        """Rows added over every table."""
        return (self.evaluations + self.results + self.runs + self.candidates + self.turns + self.events
                + self.verdicts + self.plans)


class Merge:
    """One :meth:`Store.merge` (inside the target's transaction): rows of the ``src`` connection
    copied into ``dst``, with the target store's ``secrets`` scrubbed from what is copied."""

    def __init__(self, dst: sqlite3.Connection, src: sqlite3.Connection, secrets: set[str], task: str | None):
        self.dst, self.src, self.task = dst, src, task
        self.secrets = secrets
        self.counts = MergeCounts()
        self.run_ids: dict[str, str] = {}    # source run_id -> target run_id
        self.cand_ids: dict[int, int] = {}   # source candidate id -> target candidate id
        self.eval_ids: dict[str, str] = {}   # source eval_id -> target eval_id, where it had to change

    def _insert(self, table: str, row: sqlite3.Row, skip: tuple[str, ...] = (), **override) -> int:
        cols = [c for c in columns(self.dst, table) if c in row.keys() and c not in skip]
        values = [override.get(c, row[c]) for c in cols]
        cur = self.dst.execute(f"INSERT INTO {table}({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", values)
        return inserted_id(cur)

    def _where_task(self) -> tuple[str, tuple]:
        return (" WHERE task = ?", (self.task,)) if self.task is not None else ("", ())

    def run(self) -> MergeCounts:
        self._plans()
        self._evaluations()
        self._runs()
        self._verdicts()
        return self.counts

    def _plans(self) -> None:
        for p in self.src.execute("SELECT * FROM campaigns ORDER BY recorded_at"):
            cur = self.dst.execute("INSERT OR IGNORE INTO campaigns(name, plan_sha256, plan_json, recorded_at) "
                                   "VALUES (?,?,?,?)", (p["name"], p["plan_sha256"], p["plan_json"], p["recorded_at"]))
            self.counts.plans += cur.rowcount

    def _signature(self, conn: sqlite3.Connection, eval_id: str) -> str:
        """The content of an evaluation: its header and every result record."""
        head = conn.execute("SELECT task, device, created_at, env_json FROM evaluations WHERE eval_id = ?",
                            (eval_id,)).fetchone()
        rows = sorted(tuple(r) for r in conn.execute(
            "SELECT workload, solution_sha256, role, status, record_json FROM results WHERE eval_id = ?", (eval_id,)))
        return hashlib.sha256(json.dumps([tuple(head) if head else None, rows]).encode()).hexdigest()

    def _evaluations(self) -> None:
        where, params = self._where_task()
        have = {r[0]: r[1] for r in self.dst.execute("SELECT eval_id, status FROM evaluations")}
        for ev in self.src.execute(f"SELECT * FROM evaluations{where} ORDER BY created_at, eval_id", params):
            eid = ev["eval_id"]
            if eid in have:
                if have[eid] == "running" and ev["status"] != "running":
                    self._replace_results(ev)  # the copy here was taken while it ran; the other finished it
                    continue
                mine = self._signature(self.dst, eid)
                theirs = self._signature(self.src, eid)
                if mine == theirs or have[eid] != "complete" or ev["status"] != "complete":
                    continue  # the same evaluation (a partial copy of one counts as the same)
                new = f"{eid}-{theirs[:8]}"  # another evaluation under a taken id: give it its own
                self.eval_ids[eid] = new
                if new in have:
                    continue
                self._insert("evaluations", ev, eval_id=new)
                have[new] = ev["status"]
                self.counts.evaluations += 1
                self._copy_results(eid, new)
                continue
            self._insert("evaluations", ev)
            have[eid] = ev["status"]
            self.counts.evaluations += 1
            self._copy_results(eid)

    def _copy_results(self, eval_id: str, as_id: str | None = None) -> None:
        for r in self.src.execute("SELECT * FROM results WHERE eval_id = ? ORDER BY id", (eval_id,)):
            self._insert("results", r, skip=("id",), eval_id=as_id or eval_id)
            self.counts.results += 1

    def _replace_results(self, ev: sqlite3.Row) -> None:
        self.dst.execute("DELETE FROM results WHERE eval_id = ?", (ev["eval_id"],))
        self.dst.execute("UPDATE evaluations SET status=?, finished_at=? WHERE eval_id=?",
                         (ev["status"], ev["finished_at"], ev["eval_id"]))
        self._copy_results(ev["eval_id"])

    def _new_run_id(self, row: sqlite3.Row) -> tuple[str, int]:
        key = row["run_key"] or row["run_id"]
        attempts = [r[0] for r in self.dst.execute("SELECT attempt FROM runs WHERE run_key = ? OR run_id = ?",
                                                   (key, key))]
        attempt = max([*attempts, row["attempt"] or 1]) + 1
        rid = f"{key}-a{attempt}"
        while self.dst.execute("SELECT 1 FROM runs WHERE run_id = ?", (rid,)).fetchone():
            attempt += 1
            rid = f"{key}-a{attempt}"
        return rid, attempt

    def _same_run(self, row: sqlite3.Row) -> sqlite3.Row | None:
        """This store's copy of the other store's run (same planned run, same start), if any."""
        return self.dst.execute(
            "SELECT * FROM runs WHERE COALESCE(run_key, run_id) = ? AND started_at = ? AND task = ? AND model = ? "
            "AND guidance = ? AND seed = ? AND backend = ? ORDER BY run_id = ? DESC LIMIT 1",
            (row["run_key"] or row["run_id"], row["started_at"], row["task"], row["model"], row["guidance"],
             row["seed"], row["backend"], row["run_id"])).fetchone()

    def _runs(self) -> None:
        where, params = self._where_task()
        for row in self.src.execute(f"SELECT * FROM runs{where} ORDER BY started_at, run_id", params):
            mine = self._same_run(row)
            if mine is not None:
                self.run_ids[row["run_id"]] = mine["run_id"]
            elif self.dst.execute("SELECT 1 FROM runs WHERE run_id = ?", (row["run_id"],)).fetchone() is None:
                self._insert("runs", row, final_candidate=None, config_json=self._config(row))
                self.run_ids[row["run_id"]] = row["run_id"]
                self.counts.runs += 1
            else:  # the id is taken by another run: the same planned run, attempted elsewhere
                rid, attempt = self._new_run_id(row)
                self._insert("runs", row, run_id=rid, attempt=attempt, run_key=row["run_key"] or row["run_id"],
                             final_candidate=None, config_json=self._config(row))
                self.run_ids[row["run_id"]] = rid
                self.counts.renamed_runs[row["run_id"]] = rid
                self.counts.runs += 1
            self._candidates(row["run_id"])
            self._turns(row["run_id"])
            self._events(row["run_id"])
            self._settle(row, mine)

    def _config(self, row: sqlite3.Row) -> str:
        """A run's configuration with its secrets redacted (a store written by an older version
        may hold them in plain text)."""
        try:
            return json.dumps(scrub(redact_secrets(json.loads(row["config_json"] or "{}")), self.secrets))
        except json.JSONDecodeError:
            return "{}"

    def _settle(self, row: sqlite3.Row, mine: sqlite3.Row | None) -> None:
        """Set the final candidate (remapped) of a run new here, or take the settled row of a
        run this store still has as running."""
        rid = self.run_ids[row["run_id"]]
        final = self.cand_ids.get(row["final_candidate"]) if row["final_candidate"] is not None else None
        if mine is None:
            self.dst.execute("UPDATE runs SET final_candidate = ? WHERE run_id = ?", (final, rid))
        elif mine["status"] == "running" and row["status"] != "running":
            cols = ("status", "finished_at", "exit_reason", "error", "cost_usd", "cli_cost_usd", "summary_json")
            self.dst.execute(f"UPDATE runs SET {', '.join(f'{c} = ?' for c in cols)}, final_candidate = ? "
                             "WHERE run_id = ?", (*(row[c] for c in cols), final, rid))
            self.counts.settled_runs.append(rid)

    def _candidates(self, src_run: str) -> None:
        rid = self.run_ids[src_run]
        for c in self.src.execute("SELECT * FROM candidates WHERE run_id = ? ORDER BY id", (src_run,)):
            eid = self.eval_ids.get(c["eval_id"], c["eval_id"])
            same = self.dst.execute(
                "SELECT id FROM candidates WHERE run_id = ? AND turn = ? AND solution_sha256 = ? AND "
                "eval_id IS ? AND created_at = ?", (rid, c["turn"], c["solution_sha256"], eid,
                                                    c["created_at"])).fetchone()
            if same is not None:
                self.cand_ids[c["id"]] = same[0]
                continue
            self.cand_ids[c["id"]] = self._insert("candidates", c, skip=("id",), run_id=rid, eval_id=eid)
            self.counts.candidates += 1

    def _turns(self, src_run: str) -> None:
        rid = self.run_ids[src_run]
        for t in self.src.execute("SELECT * FROM turns WHERE run_id = ? ORDER BY turn", (src_run,)):
            if self.dst.execute("SELECT 1 FROM turns WHERE run_id = ? AND turn = ?", (rid, t["turn"])).fetchone():
                continue
            self._insert("turns", t, run_id=rid)
            self.counts.turns += 1

    def _remap_data(self, data):
        if isinstance(data, dict):
            out = {}
            for k, v in data.items():
                if k == "candidate_id" and isinstance(v, int):
                    out[k] = self.cand_ids.get(v, v)
                elif k == "run_id" and isinstance(v, str):
                    out[k] = self.run_ids.get(v, v)
                elif k == "eval_id" and isinstance(v, str):
                    out[k] = self.eval_ids.get(v, v)
                else:
                    out[k] = self._remap_data(v)
            return out
        if isinstance(data, list):
            return [self._remap_data(v) for v in data]
        return data

    def _events(self, src_run: str) -> None:
        rid = self.run_ids[src_run]
        for e in self.src.execute("SELECT * FROM events WHERE run_id = ? ORDER BY seq", (src_run,)):
            if self.dst.execute("SELECT 1 FROM events WHERE run_id = ? AND seq = ?", (rid, e["seq"])).fetchone():
                continue
            data = json.dumps(scrub(self._remap_data(json.loads(e["data_json"])), self.secrets))
            self._insert("events", e, run_id=rid, data_json=data)
            self.counts.events += 1

    def _verdicts(self) -> None:
        where, params = self._where_task()
        key_cols = ("kind", "task", "target", "model", "prompt_version", "rubric_version", "input_hash", "sample",
                    "verdict_json")
        have = {tuple(r[c] for c in key_cols) for r in self.dst.execute("SELECT * FROM verdicts")}
        for v in self.src.execute(f"SELECT * FROM verdicts{where} ORDER BY id", params):
            target = self.run_ids.get(v["target"], v["target"])
            data = json.dumps(self._remap_data(json.loads(v["verdict_json"])), default=str)
            if data == json.dumps(json.loads(v["verdict_json"]), default=str):
                data = v["verdict_json"]  # unchanged: keep the stored text byte for byte
            key = tuple({"target": target, "verdict_json": data}.get(c, v[c]) for c in key_cols)
            if key in have:
                continue
            self._insert("verdicts", v, skip=("id",), target=target, verdict_json=data)
            have.add(key)
            self.counts.verdicts += 1
