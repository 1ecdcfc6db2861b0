"""Settle the evaluations of a results store brought back from another machine.

Before ``d2k bench`` closed its evaluation in the store, a bench left its evaluation ``running``
for good; and a ``d2k`` killed by SIGKILL on another machine (a device call's time limit) leaves
one that :meth:`Store.evaluation_states` cannot check (the process is not on this machine).
Reports use complete evaluations only. This script closes them from evidence written by the
harness itself:

* an evaluation whose ``d2k bench --json`` file is given (the JSON is written only once the bench
  has finished, and carries the evaluation's id) becomes ``complete``;
* with ``--rest-interrupted``, every other evaluation still ``running`` that was started on
  another host becomes ``interrupted``.

    PYTHONPATH=src python devtools/settle_store.py results/h200/d2k.sqlite results/h200/tasks/*.json --rest-interrupted

Prints what it changed. A JSON file that is no bench result, or an id the store lacks, is named
and skipped.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from d2kbench.machine import host_id
from d2kbench.store import Store


def settle(store_path: Path, bench_json: list[Path], rest_interrupted: bool) -> list[tuple[str, str, str]]:
    """Close the ``running`` evaluations of ``store_path`` as described in the module docstring.

    Returns:
        ``(eval_id, task, new status)`` for every evaluation changed.

    Raises:
        FileNotFoundError: no store at ``store_path``.
    """
    if not store_path.is_file():
        raise FileNotFoundError(f"no results store at {store_path}")
    changed = []
    with Store(store_path) as store:
        rows = {r["eval_id"]: r for r in store.conn.execute(
            "SELECT eval_id, task, host FROM evaluations WHERE status = 'running'")}
        finished = set()
        for path in bench_json:
            try:
                data = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as e:
                print(f"skipped {path}: {e}")
                continue
            eid = data.get("id") if isinstance(data, dict) and "runs" in data else None
            if eid is None:
                print(f"skipped {path}: not a d2k bench result")
            elif eid in rows:
                finished.add(eid)
        for eid in sorted(finished):
            store.finish_evaluation(eid, "complete")
            changed.append((eid, rows[eid]["task"], "complete"))
        if rest_interrupted:
            here = host_id()
            for eid, r in sorted(rows.items()):
                if eid not in finished and r["host"] != here:
                    store.finish_evaluation(eid, "interrupted")
                    changed.append((eid, r["task"], "interrupted"))
    return changed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store", type=Path)
    ap.add_argument("bench_json", type=Path, nargs="*", help="d2k bench --json files")
    ap.add_argument("--rest-interrupted", action="store_true",
                    help="evaluations of other hosts still running after that: interrupted")
    args = ap.parse_args()
    for eid, task, status in settle(args.store, args.bench_json, args.rest_interrupted):
        print(f"{eid} {task}: {status}")


if __name__ == "__main__":
    main()
