"""``devtools/settle_store.py``: evaluations left ``running`` in a store from another machine are
closed from the harness's own evidence (a finished bench's JSON), never guessed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from d2kbench.machine import host_id
from d2kbench.store import Store

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("settle_store", ROOT / "devtools" / "settle_store.py")
settle_store = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(settle_store)


def _store_with_running(path: Path, ids: list[str], host: str = "h200-vm") -> None:
    with Store(path) as s:
        for eid in ids:
            s.start_evaluation(eid, "flash_decode_splitkv", "cuda", {}, "2026-12-02T17:00:00+00:00")
        s.conn.execute("UPDATE evaluations SET host = ?", (host,))
        s.conn.commit()


def _raw_status(path: Path) -> dict[str, str]:
    with Store(path) as s:
        return {r[0]: r[1] for r in s.conn.execute("SELECT eval_id, status FROM evaluations")}


def test_a_finished_bench_completes_and_the_rest_is_interrupted(tmp_path):
    db = tmp_path / "d2k.sqlite"
    _store_with_running(db, ["aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc"])
    (tmp_path / "bench.json").write_text(json.dumps({"id": "aaaaaaaaaaaa", "runs": []}))
    (tmp_path / "other.json").write_text(json.dumps({"id": "bbbbbbbbbbbb"}))  # no bench result: skipped
    (tmp_path / "broken.json").write_text("{")
    changed = settle_store.settle(db, [tmp_path / "bench.json", tmp_path / "other.json", tmp_path / "broken.json"],
                                  rest_interrupted=False)
    assert changed == [("aaaaaaaaaaaa", "flash_decode_splitkv", "complete")]
    assert _raw_status(db) == {"aaaaaaaaaaaa": "complete", "bbbbbbbbbbbb": "running", "cccccccccccc": "running"}
    changed = settle_store.settle(db, [], rest_interrupted=True)
    assert {c[0]: c[2] for c in changed} == {"bbbbbbbbbbbb": "interrupted", "cccccccccccc": "interrupted"}
    assert settle_store.settle(db, [tmp_path / "bench.json"], rest_interrupted=True) == []  # settled rows stay


def test_evaluations_of_this_host_are_left_to_the_pid_check(tmp_path):
    db = tmp_path / "d2k.sqlite"
    _store_with_running(db, ["dddddddddddd"], host=host_id())
    assert settle_store.settle(db, [], rest_interrupted=True) == []
    assert _raw_status(db) == {"dddddddddddd": "running"}
    with pytest.raises(FileNotFoundError):
        settle_store.settle(tmp_path / "none.sqlite", [], rest_interrupted=True)
