"""Store rules that protect recorded results."""

from __future__ import annotations

from d2kbench.store import Store


def test_a_late_finish_cannot_revive_an_interrupted_attempt(tmp_path):
    """A worker that outlived a killed campaign must not mark its superseded attempt finished."""
    store = Store(tmp_path / "s.sqlite")
    kw = dict(task="muon_newton_schulz", model="m", backend="openai", guidance="none", seed=0, budget_turns=3,
              config={}, run_key="k")
    store.start_run("k-a1", attempt=1, **kw)
    store.mark_interrupted(["k-a1"], "campaign killed")
    store.start_run("k-a2", attempt=2, **kw)
    assert store.finish_run("k-a1", status="finished") is False  # the orphan's late answer
    assert store.finish_run("k-a2", status="finished") is True
    assert store.finish_run("k-a2", status="failed") is False  # closed once
    statuses = dict(store.conn.execute("SELECT run_id, status FROM runs").fetchall())
    assert statuses == {"k-a1": "interrupted", "k-a2": "finished"}
    store.close()


def _record(store: Store, eval_id: str, workload: str, mean_ms: float, task: str = "muon_newton_schulz") -> None:
    from d2kbench.harness.timing import summarize
    from d2kbench.results import SolutionRun, Status, WorkloadResult

    run = SolutionRun(solution="expert", path="expert.py", sha256="ab" * 32, role="candidate")
    res = WorkloadResult(workload=workload, status=Status.OK, timing=summarize([mean_ms] * 3, "events"))
    store.record(eval_id, task, run, res, "cuda", {"gpu": "NVIDIA H200"}, "2026-11-29T12:00:00+00:00")


def test_merge_appends_another_stores_evaluations_once(tmp_path):
    main, gpu = Store(tmp_path / "main.sqlite"), Store(tmp_path / "gpu.sqlite")
    _record(main, "e1", "w1", 1.0)
    _record(gpu, "e2", "w1", 2.0)
    _record(gpu, "e2", "w2", 3.0)
    gpu.close()
    assert main.merge(tmp_path / "gpu.sqlite").results == 2
    assert main.merge(tmp_path / "gpu.sqlite").total() == 0  # idempotent
    rows = main.rows()
    assert sorted((r["eval_id"], r["workload"], r["mean_ms"]) for r in rows) == [
        ("e1", "w1", 1.0), ("e2", "w1", 2.0), ("e2", "w2", 3.0)]
    assert main.env("e2") == {"gpu": "NVIDIA H200"}
    assert main.result(next(r for r in rows if r["workload"] == "w2")).timing.mean_ms == 3.0
    main.close()


def test_merge_can_take_one_task_only(tmp_path):
    main, gpu = Store(tmp_path / "main.sqlite"), Store(tmp_path / "gpu.sqlite")
    _record(gpu, "e1", "w1", 1.0, task="kv_cache_fp8_store")
    _record(gpu, "e2", "w1", 2.0)
    gpu.close()
    assert main.merge(tmp_path / "gpu.sqlite", task="muon_newton_schulz").results == 1
    assert [r["eval_id"] for r in main.rows()] == ["e2"]
    assert main.merge(tmp_path / "gpu.sqlite").results == 1  # the other task's evaluation, later
    main.close()


def test_merge_of_a_missing_file_raises(tmp_path):
    import pytest

    with pytest.raises(FileNotFoundError, match="no store"):
        Store(tmp_path / "m.sqlite").merge(tmp_path / "absent.sqlite")


# ---- a full merge: runs, attempts, candidates, turns, events, evaluations, verdicts, plans ---------

def _campaign_store(path, started: str, speed: float, verdict_js: float):
    """A store holding one run (attempt 1 of key k) with two candidates, turns, events, a
    verdict of its final candidate and the campaign's plan, as one machine writes it."""
    import synthetic_store as syn

    s = Store(path)
    s.record_plan("paper", {"name": "paper", "tasks": ["toy_softmax"], "agents": [{"model": "m", "backend": "openai"}]})
    rid = syn.add_run(s, "m", "none", "toy_softmax", [(1, syn.FAIL), (2, (speed, speed))], rid="k-a1", run_key="k")
    with s.conn:
        s.conn.execute("UPDATE runs SET started_at = ? WHERE run_id = ?", (started, rid))
    final = s.run(rid)["final_candidate"]
    s.add_event(rid, 2, "candidate", {"candidate_id": final, "n": 2})
    sha = next(c["solution_sha256"] for c in s.candidates_of(rid) if c["id"] == final)
    s.add_verdict(kind="impl", task="toy_softmax", target=sha, model="judge", backend="openai", prompt_version="p",
                  rubric_version="r", input_hash=f"h{verdict_js}", l1=verdict_js, l2=verdict_js, l3=verdict_js,
                  js=verdict_js, verdict={"subject": {"run_id": rid, "candidate_id": final, "sha256": sha}})
    s.close()
    return rid, sha


def _counts(store: Store) -> dict:
    return {t: store.conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
            for t in ("evaluations", "results", "runs", "candidates", "turns", "events", "verdicts", "campaigns")}


def test_a_full_merge_remaps_ids_and_adds_nothing_the_second_time(tmp_path):
    import json

    _campaign_store(tmp_path / "a.sqlite", "2026-11-28T10:00:00+00:00", 0.5, 70.0)
    # machine B attempted the same planned run (same run id k-a1) independently
    _, sha_b = _campaign_store(tmp_path / "b.sqlite", "2026-11-28T11:00:00+00:00", 0.25, 80.0)
    main = Store(tmp_path / "a.sqlite")
    before = _counts(main)
    n = main.merge(tmp_path / "b.sqlite")
    assert n.renamed_runs == {"k-a1": "k-a2"}  # B's attempt becomes the next attempt of key k
    assert (n.runs, n.candidates, n.turns, n.events, n.verdicts, n.plans) == (1, 2, 3, 1, 1, 0)
    # the failed first candidates' evaluations have one id and the same records in both stores: one
    # evaluation; the second ones share an id but not their records: B's gets an id of its own
    assert n.evaluations == 1 and n.results == 2
    b_run = main.run("k-a2")
    assert (b_run["run_key"], b_run["attempt"], b_run["started_at"]) == ("k", 2, "2026-11-28T11:00:00+00:00")
    cands = main.candidates_of("k-a2")
    final = b_run["final_candidate"]
    assert next(c for c in cands if c["id"] == final)["eval_id"].startswith("k-a1#1-")
    assert final in {c["id"] for c in cands} and final not in {c["id"] for c in main.candidates_of("k-a1")}
    event = json.loads(main.events_of("k-a2", "candidate")[0]["data_json"])
    assert event["candidate_id"] == final  # the reference inside the event follows the new id
    v = next(r for r in main.verdict_rows() if r["js"] == 80.0)  # B's verdict
    assert json.loads(v["verdict_json"])["subject"] == {"run_id": "k-a2", "candidate_id": final, "sha256": sha_b}
    after = _counts(main)
    assert main.merge(tmp_path / "b.sqlite").total() == 0 and _counts(main) == after  # idempotent
    assert main.merge(tmp_path / "b.sqlite").renamed_runs == {}
    assert after["runs"] == before["runs"] + 1
    main.close()


def test_merging_a_copy_taken_while_a_run_ran_takes_the_settled_row(tmp_path):
    import shutil

    rid, _ = _campaign_store(tmp_path / "gpu.sqlite", "2026-11-28T10:00:00+00:00", 0.5, 70.0)
    shutil.copy(tmp_path / "gpu.sqlite", tmp_path / "early.sqlite")
    early = Store(tmp_path / "early.sqlite")
    with early.conn:  # the copy was taken while the run was still running
        early.conn.execute("UPDATE runs SET status = 'running', final_candidate = NULL WHERE run_id = ?", (rid,))
    n = early.merge(tmp_path / "gpu.sqlite")
    assert n.settled_runs == [rid] and n.runs == 0 and n.candidates == 0
    assert early.run(rid)["status"] == "finished" and early.run(rid)["final_candidate"] is not None
    early.close()


def test_merge_into_itself_is_refused(tmp_path):
    import pytest

    s = Store(tmp_path / "s.sqlite")
    with pytest.raises(ValueError, match="into itself"):
        s.merge(tmp_path / "s.sqlite")
    s.close()


# ---- evaluation status ------------------------------------------------------------------------------

def test_an_evaluation_is_running_until_finished_and_a_dead_writer_reads_interrupted(tmp_path):
    import subprocess
    import sys

    import pytest

    s = Store(tmp_path / "s.sqlite")
    s.start_evaluation("e1", "muon_newton_schulz", "cpu", {"device": "cpu"}, "2026-11-29T12:00:00+00:00")
    _record(s, "e1", "w1", 1.0)
    assert s.evaluation_states()["e1"] == "running"
    s.finish_evaluation("e1")
    assert s.evaluation_states()["e1"] == "complete"
    s.finish_evaluation("e1", "interrupted")  # closed once: a late call changes nothing
    assert s.evaluation_states()["e1"] == "complete"
    _record(s, "e2", "w1", 1.0)  # a writer that died before finishing: its pid is gone
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with s.conn:
        s.conn.execute("UPDATE evaluations SET pid = ? WHERE eval_id = 'e2'", (int(dead.stdout),))
    assert s.evaluation_states()["e2"] == "interrupted"
    with pytest.raises(ValueError, match="complete or interrupted"):
        s.finish_evaluation("e1", "done")
    s.close()


def test_reports_use_complete_evaluations_only(tmp_path):
    import synthetic_store as syn

    from d2kbench.report.data import Selection, load

    s = Store(tmp_path / "s.sqlite")
    syn.add_evaluation(s, "ok", "toy_softmax", "expert", syn.sha("expert"), "candidate", (0.25, 1.0))
    syn.add_evaluation(s, "cut", "toy_softmax", "expert", syn.sha("expert"), "candidate", (90.0, 90.0),
                       status="interrupted")
    data = load(s, Selection(tasks=["toy_softmax"]))
    assert data.solutions["toy_softmax"]["expert"]["w1"].mean_ms == 0.25  # 90 ms never pooled in
    assert data.incomplete_evaluations == {"interrupted": 1}
    s.close()


# ---- secrets never reach the store ------------------------------------------------------------------

def test_secrets_in_a_run_config_and_a_plan_are_redacted(tmp_path):
    import json

    from d2kbench.store.redact import REDACTED, is_secret_name, redact_url

    s = Store(tmp_path / "s.sqlite")
    cfg = {"base_url": "https://user:hunter2@api.example.test/v1?api-key=sk-1&region=eu",
           "backend_options": {"api_key": "sk-live-123", "reasoning_effort": "high",
                               "env": {"ANTHROPIC_AUTH_TOKEN": "tok-9", "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "8000"}},
           "max_tokens": 16384}
    s.start_run("r1", task="t", model="m", backend="openai", guidance="none", seed=0, budget_turns=1, config=cfg)
    text = s.run("r1")["config_json"]
    for secret in ("sk-live-123", "hunter2", "tok-9", "sk-1"):
        assert secret not in text
    stored = json.loads(text)
    assert stored["backend_options"]["api_key"] == REDACTED and stored["backend_options"]["reasoning_effort"] == "high"
    assert stored["backend_options"]["env"] == {"ANTHROPIC_AUTH_TOKEN": REDACTED, "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "8000"}
    assert stored["max_tokens"] == 16384 and stored["base_url"].startswith("https://api.example.test/v1?")
    s.record_plan("p", {"agents": [{"model": "m", "options": {"apiKey": "sk-2"}}]})
    assert "sk-2" not in s.plans(["p"])[0]["plan_json"]
    assert not is_secret_name("max_tokens") and is_secret_name("apiKey") and is_secret_name("client_secret")
    assert redact_url("not a url") == "not a url"
    s.close()


# ---- a merged store reports what the union reports ---------------------------------------------------

def _report(path, out):
    """The report pages of the store at ``path`` (Markdown and CSV), with candidate ids blanked
    (ids are local to a store file; the runs, candidates, turns and scores are not)."""
    import re

    from d2kbench.report.build import build_report
    from d2kbench.report.data import load
    from d2kbench.scoring.baseline import parse_baseline

    s = Store(path)
    try:
        data = load(s, baseline=parse_baseline("reference"))
    finally:
        s.close()
    build_report(data, parse_baseline("reference"), out, ["md", "csv"])
    pages = {}
    for page in sorted(out.rglob("*.md")) + sorted(out.rglob("*.csv")):
        lines, in_runs = [], False
        for line in page.read_text().splitlines():
            in_runs = in_runs or line == "## Runs"
            cells = line.split("|") if in_runs and line.startswith("| model-") else None
            lines.append("|".join(cells[:4] + ["#"] + cells[5:]) if cells else line)
        if page.name == "runs.csv":
            lines = [",".join(c if i != 3 else "#" for i, c in enumerate(row.split(","))) for row in lines]
        pages[str(page.relative_to(out))] = re.sub(r"candidate \d+", "candidate #", "\n".join(lines))
    return pages


def test_a_merged_store_reports_what_the_union_reports(tmp_path):
    """Two machines hold models a, b and models c, d (each with the plans and the task solutions'
    evaluations, an interrupted one included): merged, they give the report of one store that
    holds everything, and merging again changes nothing."""
    import synthetic_store as syn

    for d in ("union", "gpu1", "gpu2"):
        (tmp_path / d).mkdir()
    union = syn.build(tmp_path / "union" / "golden.sqlite")
    merged = syn.build(tmp_path / "gpu1" / "golden.sqlite", {"model-a", "model-b"})
    syn.build(tmp_path / "gpu2" / "golden.sqlite", {"model-c", "model-d"})
    s = Store(merged)
    n = s.merge(tmp_path / "gpu2" / "golden.sqlite")
    # model-c: 4 settled runs and 1 running, model-d: 1, one evaluation per candidate (6); the 9
    # solution evaluations both stores hold are recognised by content and added once
    counts = (n.runs, n.candidates, n.evaluations, n.turns, n.renamed_runs)
    want = _report(union, tmp_path / "r-union")
    got = _report(merged, tmp_path / "r-merged")
    assert set(got) == set(want) and len(want) > 10
    for page in want:
        assert got[page] == want[page], page
    assert "evaluations left out (not complete): 1 interrupted" in got["report.md"]
    assert counts == (6, 6, 6, 6 * 3, {})
    assert _counts(s) == _counts(Store(union))
    assert s.merge(tmp_path / "gpu2" / "golden.sqlite").total() == 0
    s.close()


def test_secret_values_in_free_text_never_reach_the_store(tmp_path, monkeypatch):
    """An agent CLI prints its environment in a tool result, a provider error quotes the URL it
    called, a candidate note repeats a token: the known secret values (credential variables of
    the environment, keys added by the runner) and credentials in URLs are redacted wherever
    they occur; ordinary values of other variables (PWD) stay."""
    import json

    from d2kbench.store.redact import REDACTED, is_credential_variable, scrub, secret_values

    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-0123456789")
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijkl")
    monkeypatch.setenv("PWD", "/home/someone/project")
    s = Store(tmp_path / "s.sqlite")
    s.add_secrets(["sk-added-by-the-runner", None, "short"])
    s.start_run("r", task="t", model="m", backend="openai", guidance="none", seed=0, budget_turns=1,
                config={"note": "key sk-added-by-the-runner"})
    s.add_event("r", 1, "tool_result", {"content": "OPENAI_API_KEY=sk-env-0123456789\nHF_TOKEN=hf_abcdefghijkl\n"
                                                   "PWD=/home/someone/project"})
    s.add_event("r", 2, "error", {"message": "401 from https://bob:pw-123456@api.example.test/v1?api-key=zzz&x=1 "
                                             "and http://127.0.0.1:8000/v1/models"})
    s.add_candidate("r", turn=2, solution_sha256="ab", path="p", eval_id=None, eligible=False, geomean_speedup=None,
                    note="uses sk-added-by-the-runner")
    s.finish_run("r", status="failed", error="Error: key sk-env-0123456789 rejected",
                 summary={"final_text": "my key: sk-added-by-the-runner"})
    s.add_verdict(kind="impl", task="t", target="x", model="j", backend="openai", prompt_version="p",
                  rubric_version="r", input_hash="h", l1=0, l2=0, l3=0, js=0,
                  verdict={"judge": {"base_url": "https://u:secret-pw@judge.example.test/v1"}})
    s.close()
    raw = (tmp_path / "s.sqlite").read_bytes()
    for secret in (b"sk-env-0123456789", b"hf_abcdefghijkl", b"sk-added-by-the-runner", b"pw-123456", b"zzz",
                   b"secret-pw"):
        assert secret not in raw, secret
    s = Store(tmp_path / "s.sqlite")
    tool, err = (json.loads(e["data_json"]) for e in s.events_of("r"))
    assert tool["content"] == f"OPENAI_API_KEY={REDACTED}\nHF_TOKEN={REDACTED}\nPWD=/home/someone/project"
    assert err["message"] == (f"401 from https://api.example.test/v1?api-key={REDACTED}&x=1 and "
                              "http://127.0.0.1:8000/v1/models")  # a URL without credentials is unchanged
    assert s.run("r")["error"] == f"Error: key {REDACTED} rejected"
    s.close()
    assert is_credential_variable("ANTHROPIC_AUTH_TOKEN") and not is_credential_variable("PWD")
    assert not is_credential_variable("SSH_AUTH_SOCK") and not is_credential_variable("MAX_TOKENS_X")  # plural
    assert secret_values({"env": {"ANTHROPIC_API_KEY": "sk-ant-12345678"}, "api_key": "abc"}) == {"sk-ant-12345678"}
    assert scrub({"k": ["sk-ant-12345678 x"]}, {"sk-ant-12345678"}) == {"k": [f"{REDACTED} x"]}


def test_store_as_a_context_manager_closes_its_connection(tmp_path):
    import sqlite3

    import pytest

    with Store(tmp_path / "s.sqlite") as store:
        store.conn.execute("SELECT 1")
    with pytest.raises(sqlite3.ProgrammingError):
        store.conn.execute("SELECT 1")  # closed on leaving the block
    with pytest.raises(RuntimeError), Store(tmp_path / "s.sqlite") as again:
        raise RuntimeError("an error inside the block")
    with pytest.raises(sqlite3.ProgrammingError):
        again.conn.execute("SELECT 1")  # closed on an error too
