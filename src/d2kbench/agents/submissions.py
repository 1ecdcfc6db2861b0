"""Submissions: snapshot, hand-over to the evaluator, evaluation as a candidate.

The submit tool (any process: the MCP server, a ``tools/submit`` command, the built-in loop)
copies ``solution.py`` to ``RUN_DIR/candidates/NNN-<sha12>.py`` and writes
``RUN_DIR/submissions/NNN.request.json`` (number, turn, SHA-256, note). When a runner owns
the workspace (``WorkspaceConfig.runner``) its :class:`SubmissionQueue` evaluates the request,
records the candidate and a ``candidate`` trajectory event in the store, and writes
``NNN.result.json``, which the tool waits for and shows the agent. Without a runner (a
hand-made workspace) the tool evaluates in its own process and stores nothing.

A snapshot whose content no longer matches its recorded hash (edited after submission) is
rejected, not evaluated. The queue evaluates, screens (held-back copies) and records its own
copy of the snapshot, outside the folders the agent can write, so an edit during the
evaluation changes nothing.
"""

from __future__ import annotations

import hashlib
import shutil
import threading
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel

from d2kbench.agents import requests
from d2kbench.agents.leaks import held_back_copies
from d2kbench.agents.tools import clip, evaluate_solution, evaluation_text, load_task_of
from d2kbench.agents.workspace import WorkspaceConfig, load_config, locked_dir
from d2kbench.scoring.records import HELD_BACK_COPY
from d2kbench.store import Store


class SubmissionRequest(BaseModel):
    """One submission: its number (1-based), the turn it came in, the snapshot and its hash."""

    n: int
    turn: int
    sha256: str
    snapshot: str
    note: str = ""
    source: str = "cli"
    created_at: str


class SubmissionResult(BaseModel):
    """The outcome of one submission, as the agent sees it (``text``) and as data."""

    n: int
    status: str  # evaluated | rejected | error | held_back_copy
    eligible: bool | None = None
    geomean_speedup: float | None = None
    candidate_id: int | None = None
    eval_id: str | None = None
    sha256: str = ""
    text: str = ""


def sha256_of(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def current_turn(run_dir: Path) -> int:
    """The runner's current turn (``RUN_DIR/turn``), 0 when unknown."""
    try:
        return int((Path(run_dir) / "turn").read_text().strip() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def set_turn(run_dir: Path, turn: int) -> None:
    """Publish the current turn for submissions made by tool processes."""
    p = Path(run_dir) / "turn"
    tmp = p.with_suffix(".tmp")
    tmp.write_text(str(turn))
    tmp.replace(p)


def snapshot(workspace: Path, cfg: WorkspaceConfig, note: str = "", turn: int | None = None,
             source: str = "cli") -> SubmissionRequest:
    """Copy ``solution.py`` into the run directory and write the request.

    Raises:
        FileNotFoundError: the workspace has no ``solution.py``.
    """
    run_dir = Path(cfg.run_dir)
    sol = Path(workspace) / "solution.py"
    if not sol.is_file():
        raise FileNotFoundError(f"{sol} does not exist: write your solution there first")
    with locked_dir(run_dir):
        subs = run_dir / "submissions"
        subs.mkdir(exist_ok=True)
        n = len(list(subs.glob("*.request.json"))) + 1
        data = sol.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        cand_dir = run_dir / "candidates"
        cand_dir.mkdir(exist_ok=True)
        snap = cand_dir / f"{n:03d}-{sha[:12]}.py"
        snap.write_bytes(data)
        snap.chmod(0o444)
        req = SubmissionRequest(n=n, turn=turn if turn is not None else current_turn(run_dir), sha256=sha,
                                snapshot=str(snap), note=note[:500], source=source,
                                created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        tmp = subs / f"{n:03d}.request.tmp"
        tmp.write_text(req.model_dump_json(indent=1))
        tmp.replace(subs / f"{n:03d}.request.json")
    return req


def result_path(run_dir: Path, n: int) -> Path:
    return Path(run_dir) / "submissions" / f"{n:03d}.result.json"


def write_result(run_dir: Path, res: SubmissionResult) -> None:
    p = result_path(run_dir, res.n)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(res.model_dump_json(indent=1))
    tmp.replace(p)


def evaluate_request(cfg: WorkspaceConfig, req: SubmissionRequest, store=None,
                     cand_dir: Path | None = None) -> tuple[SubmissionResult, object]:
    """Evaluate one snapshot with the harness (candidate vs the configured baseline).

    Args:
        cand_dir: the folder the snapshot must be in (default: the run directory's
            ``candidates``, where the submit tool puts it; the queue passes its trusted copies').

    Returns:
        (result, Evaluation or None). Never raises: harness errors become ``status="error"``.
    """
    snap = Path(req.snapshot)
    cand_dir = Path(cand_dir or Path(cfg.run_dir) / "candidates").resolve()
    if snap.resolve().parent != cand_dir or not snap.name.startswith(f"{req.n:03d}-{req.sha256[:12]}"):
        return SubmissionResult(n=req.n, status="rejected", sha256=req.sha256,
                                text=f"submission {req.n} rejected: its snapshot {snap} is not the one the submit "
                                     f"tool made (expected {cand_dir}/{req.n:03d}-{req.sha256[:12]}.py)"), None
    if not snap.is_file() or sha256_of(snap) != req.sha256:
        return SubmissionResult(n=req.n, status="rejected", sha256=req.sha256,
                                text=f"submission {req.n} rejected: its snapshot was modified or removed after "
                                     f"submission (expected sha256 {req.sha256[:12]})"), None
    try:
        ev = evaluate_solution(cfg, snap, timed=True, baseline=True, store=store)
    except Exception as e:  # noqa: BLE001 - a harness failure must not end the run
        return SubmissionResult(n=req.n, status="error", sha256=req.sha256,
                                text=f"submission {req.n}: evaluation error: {type(e).__name__}: {e}\n"
                                     + traceback.format_exc(limit=3)), None
    ok = ev.candidate.eligible
    head = (f"submission {req.n} ({req.sha256[:12]}): " +
            ("ELIGIBLE (every check passed)" if ok else "NOT ELIGIBLE (some checks failed)"))
    if ev.geomean_speedup is not None:
        head += f", geomean speedup {ev.geomean_speedup:.3f}x"
    return SubmissionResult(n=req.n, status="evaluated", eligible=ok, geomean_speedup=ev.geomean_speedup,
                            eval_id=ev.id, sha256=req.sha256,
                            text=clip(head + "\n\n" + evaluation_text(ev, f"candidate {req.n}"))), ev


def submit(workspace: Path, note: str = "", turn: int | None = None, source: str = "cli",
           poll_s: float = 0.25) -> SubmissionResult:
    """The submit tool: snapshot, then wait for the runner's evaluation (or evaluate here when
    no runner owns the workspace).

    Raises:
        FileNotFoundError: no ``solution.py`` / not a workspace.
    """
    cfg = load_config(workspace)
    req = snapshot(workspace, cfg, note=note, turn=turn, source=source)
    run_dir = Path(cfg.run_dir)
    if not cfg.runner:
        res, _ = evaluate_request(cfg, req)
        write_result(run_dir, res)
        return res
    deadline = time.monotonic() + cfg.submit_timeout_s
    p = result_path(run_dir, req.n)
    while time.monotonic() < deadline:
        if p.is_file():
            return SubmissionResult.model_validate_json(p.read_text())
        time.sleep(poll_s)
    return SubmissionResult(n=req.n, status="error", sha256=req.sha256,
                            text=f"submission {req.n} was recorded but its evaluation did not finish within "
                                 f"{cfg.submit_timeout_s:.0f} s; it will still be evaluated")


class SubmissionQueue:
    """The runner's side: evaluates pending requests of a run directory, records candidates.

    Args:
        workspace: the run's workspace (its configuration names the run directory).
        store_path: the SQLite store (each thread opens its own connection).
        run_id: the run the candidates belong to.
        on_result: called with each :class:`SubmissionResult` after it is recorded.
    """

    def __init__(self, workspace: Path, store_path: Path, run_id: str,
                 on_result: Callable[[SubmissionResult], None] | None = None,
                 turn_of: Callable[[], int] | None = None):
        self.workspace = Path(workspace)
        self.cfg = load_config(workspace)  # read once, before the agent starts: its later edits do not count
        self.turn_of = turn_of
        self.run_dir = Path(self.cfg.run_dir)
        self.store_path = Path(store_path)
        self.run_id = run_id
        self.on_result = on_result
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # where the queue keeps its own copy of each snapshot: outside every folder the agent can
        # write (a runner's run directory holds the agent's control folder and workspace, not this)
        self.trusted_dir = (self.run_dir.parent if self.cfg.runner else self.run_dir) / "candidates-evaluated"
        self.results: dict[int, SubmissionResult] = {}
        self._answered: set[int] = set()  # tool requests answered

    def pending(self) -> list[SubmissionRequest]:
        subs = self.run_dir / "submissions"
        out = []
        for f in sorted(subs.glob("*.request.json")) if subs.is_dir() else []:
            req = SubmissionRequest.model_validate_json(f.read_text())
            if req.n not in self.results and not result_path(self.run_dir, req.n).is_file():
                out.append(req)
        return out

    def process(self, req: SubmissionRequest) -> SubmissionResult:
        """Evaluate, record (candidate row + ``candidate`` event) and answer one request."""
        with self._lock:
            if req.n in self.results:
                return self.results[req.n]
            # the runner's own turn count when it has one (a request file is agent-writable)
            turn = self.turn_of() if self.turn_of is not None else req.turn
            store = Store(self.store_path)
            try:
                own = self._trusted_copy(req)
                if own is not None:  # evaluated, screened and recorded: one copy the agent cannot touch
                    req = own
                res, _ev = evaluate_request(self.cfg, req, store=store,
                                            cand_dir=self.trusted_dir if own is not None else None)
                copies = self._copies(req)
                if copies:  # not the agent's work: recorded, never eligible, counted by every report
                    res.status, res.eligible = HELD_BACK_COPY, False
                    res.text = (f"submission {req.n}: NOT ELIGIBLE: it reproduces held-back code of this task ("
                                + ", ".join(f"{c['file']} {c['similarity']:.2f}" for c in copies) + ")\n\n" + res.text)
                res.candidate_id = store.add_candidate(
                    self.run_id, turn=turn, solution_sha256=req.sha256, path=req.snapshot, eval_id=res.eval_id,
                    eligible=bool(res.eligible), geomean_speedup=res.geomean_speedup, status=res.status,
                    note=req.note or None)
                store.add_event(self.run_id, turn, "candidate",
                                {"n": req.n, "candidate_id": res.candidate_id, "sha256": req.sha256,
                                 "status": res.status, "eligible": res.eligible,
                                 "geomean_speedup": res.geomean_speedup, "eval_id": res.eval_id,
                                 "source": req.source, "note": req.note, "snapshot": req.snapshot,
                                 "claimed_turn": req.turn,
                                 **({"error": res.text[:2000]} if res.status != "evaluated" else {})})
                if copies:
                    store.add_event(self.run_id, turn, "leak_suspect",
                                    {"candidate_id": res.candidate_id, "n": req.n, "copy_of": copies})
            finally:
                store.close()
            write_result(self.run_dir, res)
            self.results[req.n] = res
        if self.on_result:
            self.on_result(res)
        return res

    def _trusted_copy(self, req: SubmissionRequest) -> SubmissionRequest | None:
        """``req`` pointing at the queue's own copy of its snapshot, made from one read whose hash
        is the request's; None when the snapshot is not the submit tool's or no longer matches
        (:func:`evaluate_request` then says why). The agent can write its snapshot folder: an
        edit while the candidate is evaluated or screened for held-back code must change nothing."""
        snap = Path(req.snapshot)
        if snap.resolve().parent != (self.run_dir / "candidates").resolve() or \
                not snap.name.startswith(f"{req.n:03d}-{req.sha256[:12]}") or not snap.is_file():
            return None
        data = snap.read_bytes()
        if hashlib.sha256(data).hexdigest() != req.sha256:
            return None
        self.trusted_dir.mkdir(parents=True, exist_ok=True)
        own = self.trusted_dir / snap.name
        if own.exists():
            own.chmod(0o644)
        own.write_bytes(data)
        own.chmod(0o444)
        return req.model_copy(update={"snapshot": str(own)})

    def _copies(self, req: SubmissionRequest) -> list[dict]:
        try:
            return held_back_copies(load_task_of(self.cfg).root, Path(req.snapshot))
        except Exception:  # noqa: BLE001 - a screening failure must not lose the candidate
            return []

    def answer_tools(self) -> int:
        """Answer the sandboxed agent's pending ``test``/``bench``/``profile`` requests
        (:mod:`d2kbench.agents.requests`); returns how many."""
        todo = requests.pending(self.cfg, self._answered)
        for req in todo:
            with self._lock:
                requests.answer(self.cfg, req)
                self._answered.add(req.n)
        return len(todo)

    def drain(self) -> list[SubmissionResult]:
        """Process every pending request now (in this thread)."""
        return [self.process(r) for r in self.pending()]

    def start(self, interval_s: float = 0.25) -> SubmissionQueue:
        """Process requests on a background thread until :meth:`stop`."""
        def loop() -> None:
            while not self._stop.is_set():
                for r in self.pending():
                    self.process(r)
                self.answer_tools()
                self._stop.wait(interval_s)

        self._thread = threading.Thread(target=loop, name=f"submissions-{self.run_id}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the background thread (after its current evaluation), then drain the rest."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.drain()
        self.answer_tools()


def remove_tree(path: Path) -> None:
    """Delete a directory tree if it exists (read-only snapshots included)."""
    if Path(path).exists():
        for p in Path(path).rglob("*"):
            try:
                p.chmod(0o755 if p.is_dir() else 0o644)
            except OSError:
                pass
        shutil.rmtree(path, ignore_errors=True)
