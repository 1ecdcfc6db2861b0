"""Submissions: snapshot, hand-over to the evaluator, evaluation as a candidate.

The submit tool (any process: the MCP server, a ``tools/submit`` command, the built-in loop)
copies ``solution.py`` to ``RUN_DIR/candidates/NNN-<sha12>.py`` and writes
``RUN_DIR/submissions/NNN.request.json`` (number, turn, SHA-256, note). When a runner owns
the workspace (``WorkspaceConfig.runner``) its :class:`SubmissionQueue` evaluates the request,
records the candidate and a ``candidate`` trajectory event in the store, and writes
``NNN.result.json``, which the tool waits for and shows the agent. Without a runner (a
hand-made workspace) the tool evaluates in its own process and stores nothing.

A snapshot whose content no longer matches its recorded hash (edited after submission) is
rejected, not evaluated.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import threading
import time
import traceback
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from pydantic import BaseModel

from d2kbench.agents.workspace import WorkspaceConfig, load_config


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
    status: str  # evaluated | rejected | error
    eligible: bool | None = None
    geomean_speedup: float | None = None
    candidate_id: int | None = None
    eval_id: str | None = None
    sha256: str = ""
    text: str = ""


def sha256_of(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@contextmanager
def _locked(run_dir: Path):
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".submit.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


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
    with _locked(run_dir):
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


def evaluate_request(cfg: WorkspaceConfig, req: SubmissionRequest, store=None) -> tuple[SubmissionResult, object]:
    """Evaluate one snapshot with the harness (candidate vs the configured baseline).

    Returns:
        (result, Evaluation or None). Never raises: harness errors become ``status="error"``.
    """
    from d2kbench.agents.tools import clip, evaluate_solution, evaluation_text

    snap = Path(req.snapshot)
    cand_dir = (Path(cfg.run_dir) / "candidates").resolve()
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


def code_fingerprint(text: str) -> str:
    """SHA-256 of Python source's syntax tree without docstrings (bare string statements): a copy
    with edited comments, docstrings or layout has the same fingerprint (unparseable text: its
    whitespace-split words)."""
    import ast

    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return hashlib.sha256(" ".join(text.split()).encode()).hexdigest()
    for node in ast.walk(tree):  # bare string statements (docstrings) do nothing: drop them
        body = getattr(node, "body", None)
        if isinstance(body, list):
            kept = [b for b in body if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)
                                            and isinstance(b.value.value, str))]
            node.body = kept or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree, annotate_fields=False).encode()).hexdigest()


def held_back_copies(task_root: Path, snapshot: Path) -> list[str]:
    """Names of the task's own solutions (``solutions/*.py``, held back from agents) that the
    snapshot reproduces token for token (comments and layout ignored)."""
    sols = sorted((Path(task_root) / "solutions").glob("*.py"))
    if not sols:
        return []
    mine = code_fingerprint(Path(snapshot).read_text(errors="replace"))
    return [p.name for p in sols if code_fingerprint(p.read_text(errors="replace")) == mine]


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
        self.results: dict[int, SubmissionResult] = {}

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
        from d2kbench.store import Store

        with self._lock:
            if req.n in self.results:
                return self.results[req.n]
            # the runner's own turn count when it has one (a request file is agent-writable)
            turn = self.turn_of() if self.turn_of is not None else req.turn
            store = Store(self.store_path)
            try:
                res, _ev = evaluate_request(self.cfg, req, store=store)
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
                copies = self._copies(req)
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

    def _copies(self, req: SubmissionRequest) -> list[str]:
        try:
            from d2kbench.agents.tools import load_task_of

            return held_back_copies(load_task_of(self.cfg).root, Path(req.snapshot))
        except Exception:  # noqa: BLE001 - a screening failure must not lose the candidate
            return []

    def drain(self) -> list[SubmissionResult]:
        """Process every pending request now (in this thread)."""
        return [self.process(r) for r in self.pending()]

    def start(self, interval_s: float = 0.25) -> "SubmissionQueue":
        """Process requests on a background thread until :meth:`stop`."""
        def loop() -> None:
            while not self._stop.is_set():
                for r in self.pending():
                    self.process(r)
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


def remove_tree(path: Path) -> None:
    """Delete a directory tree if it exists (read-only snapshots included)."""
    if Path(path).exists():
        for p in Path(path).rglob("*"):
            try:
                p.chmod(0o755 if p.is_dir() else 0o644)
            except OSError:
                pass
        shutil.rmtree(path, ignore_errors=True)
