"""Workspaces: what is staged per guidance level, what is held back, the brief, the tools as
commands and as an MCP server, and submissions (snapshot, hash check)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from d2kbench.agents.leaks import COPY_THRESHOLD, code_fingerprint, held_back_copies
from d2kbench.agents.submissions import (
    SubmissionQueue,
    evaluate_request,
    sha256_of,
    snapshot,
)
from d2kbench.agents.workspace import (
    GUIDANCE_LEVELS,
    EvalSettings,
    load_config,
    render_guidance,
    stage_workspace,
    workspace_files,
)
from d2kbench.harness.evil import EVIL_DIR
from d2kbench.tasks import load_task
from d2kbench.tasks.loader import SHARED_FILES, public_task_yaml

TASK = "muon_newton_schulz"


@pytest.fixture(scope="module")
def task():
    return load_task(TASK)


@pytest.mark.parametrize("level", GUIDANCE_LEVELS)
def test_workspace_holds_shared_files_guidance_and_brief_but_never_expert_or_rubric(tmp_path, task, level):
    ws = stage_workspace(task, tmp_path / "ws", level, device="cpu", budget_turns=123)
    files = {str(p) for p in workspace_files(ws)}
    for name in SHARED_FILES:
        want = public_task_yaml(task.root).encode() if name == "task.yaml" else (task.root / name).read_bytes()
        assert (ws / name).read_bytes() == want
    # the public task.yaml: the same specification without the design notes (no workspace
    # names the expert design, the unguided one included)
    public = yaml.safe_load((ws / "task.yaml").read_text())
    assert [w["id"] for w in public["workloads"]] == [w.id for w in task.spec.workloads]
    assert public["args"] == yaml.safe_load((task.root / "task.yaml").read_text())["args"]
    assert set(public["sol"]) == {"reference"} and "origin" not in public and "alternatives" not in public
    text = (ws / "task.yaml").read_text().lower()
    for design_word in ("gram", "restart", "rationale", "symmetric"):
        assert design_word not in text, design_word
    assert (ws / "solution.py").read_bytes() == (task.root / "template.py").read_bytes()
    assert {"CLAUDE.md", "AGENTS.md", "workloads.yaml", ".mcp.json", ".d2k/workspace.json",
            "tools/test", "tools/bench", "tools/profile", "tools/submit"} <= files
    assert ("GUIDANCE.md" in files) == (level != "none")
    # held back: no file named like them, no file with their content, no excerpt of them beyond
    # what the shared task files themselves contain (e.g. the public coefficient table)
    held = [task.root / "rubric.yaml"] + sorted((task.root / "solutions").glob("*.py"))
    assert not any(Path(f).name in {"expert.py", "rubric.yaml", "straightforward.py"} for f in files)
    shared = b"\n".join((ws / n).read_bytes() for n in SHARED_FILES)
    for f in files:
        data = (ws / f).read_bytes()
        for h in held:
            hb = h.read_bytes()
            assert data != hb, f"{f} equals {h.name}"
            chunks = [hb[i:i + 120] for i in range(0, max(1, len(hb) - 120), 60)]
            leaked = [c for c in chunks if len(c) == 120 and c in data and c not in shared]
            assert not leaked, f"{f} quotes {h.name}: {leaked[0][:60]!r}"
    brief = (ws / "CLAUDE.md").read_text()
    assert brief == (ws / "AGENTS.md").read_text()
    for needle in ("NVIDIA H200", "sm_90", "123 turns", "tools/test", "tools/submit", "requirements.md",
                   "highest geometric-mean speedup"):
        assert needle in brief
    assert ("GUIDANCE.md" in brief) == (level != "none")
    wl = yaml.safe_load((ws / "workloads.yaml").read_text())
    assert [w["id"] for w in wl["registered"]] == [w.id for w in task.spec.workloads]
    assert os.access(ws / "tools" / "submit", os.X_OK)
    cfg = load_config(ws)
    assert cfg.task == TASK and cfg.guidance == level and cfg.device == "cpu"


def _keys(node) -> set[str]:
    if isinstance(node, dict):
        return set(node) | {k for v in node.values() for k in _keys(v)}
    if isinstance(node, list):
        return {k for v in node for k in _keys(v)}
    return set()


@pytest.mark.parametrize("task_id", __import__("d2kbench.tasks", fromlist=["list_tasks"]).list_tasks())
def test_every_unguided_workspace_holds_the_public_subset_only(tmp_path, task_id):
    """One public subset per task (``tasks.loader``: the shared files, the public rendering of
    ``task.yaml``): no unguided workspace holds design notes, origins, alternatives or the
    work models of designs, and no guidance text."""
    from d2kbench.tasks.loader import PRIVATE_ANYWHERE, PRIVATE_KEYS, PRIVATE_SOL_KEYS

    t = load_task(task_id)
    ws = stage_workspace(t, tmp_path / "ws", "none", device="cpu")
    public = yaml.safe_load((ws / "task.yaml").read_text())
    assert not _keys(public) & set(PRIVATE_ANYWHERE), task_id
    assert not set(public) & set(PRIVATE_KEYS) and not set(public.get("sol") or {}) & set(PRIVATE_SOL_KEYS)
    assert public["workloads"] and public["args"]
    assert not (ws / "GUIDANCE.md").exists()
    files = {str(p) for p in workspace_files(ws)}
    assert not {f for f in files if f.startswith(("solutions", "rubric", "guidance", "calibration"))}, files
    texts = "\n".join((ws / f).read_text(errors="replace") for f in files)
    for item in t.guidance.items:  # no title and no sentence of the guidance
        assert item.title not in texts, (task_id, item.title)
        for sentence in item.text.replace("\n", " ").split(". "):
            if len(sentence.strip()) > 60:
                assert sentence.strip() not in texts, (task_id, sentence.strip()[:80])


def test_guidance_is_cumulative_by_level(task):
    items = {i.level: [] for i in task.guidance.items}
    for i in task.guidance.items:
        items[i.level].append(i.title)
    assert render_guidance(task, "none") is None
    l1, l12, l123 = (render_guidance(task, lv) for lv in ("L1", "L1+L2", "L1+L2+L3"))
    for title in items["L1"]:
        assert title in l1 and title in l12 and title in l123
    for title in items["L2"]:
        assert title not in l1 and title in l12 and title in l123
    for title in items["L3"]:
        assert title not in l12 and title in l123
    assert "def " not in l123  # rationale, not code


def test_bad_level_and_non_empty_directory_are_refused(tmp_path, task):
    with pytest.raises(ValueError, match="unknown guidance level 'L2'"):
        stage_workspace(task, tmp_path / "a", "L2")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("x")
    with pytest.raises(ValueError, match="not empty"):
        stage_workspace(task, tmp_path / "b", "none")
    with pytest.raises(FileNotFoundError, match="not a D2K workspace"):
        load_config(tmp_path / "b")


def test_d2k_workspace_command(tmp_path):
    out = subprocess.run([sys.executable, "-m", "d2kbench.cli", "workspace", TASK, str(tmp_path / "w"),
                          "--guidance", "L1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "GUIDANCE.md" in out.stdout and (tmp_path / "w" / "GUIDANCE.md").is_file()
    out = subprocess.run([sys.executable, "-m", "d2kbench.cli", "workspace", TASK, str(tmp_path / "v"),
                          "--guidance", "L4"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "unknown guidance level 'L4'" in out.stdout


def test_tool_command_runs_on_the_workspace(tmp_path, task):
    ws = stage_workspace(task, tmp_path / "ws", "none", device="cpu",
                         eval_settings=EvalSettings(workloads=["smoke_wide_2x32x96"], check_calls=1))
    out = subprocess.run([str(ws / "tools" / "profile")], capture_output=True, text=True, timeout=300, cwd=ws)
    # the template raises NotImplementedError: the tool reports it and exits 1, it does not crash
    assert out.returncode == 1 and "NotImplementedError" in out.stdout


def test_mcp_server_lists_and_calls_the_tools(tmp_path, task):
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    ws = stage_workspace(task, tmp_path / "ws", "none", device="cpu")
    spec = json.loads((ws / ".mcp.json").read_text())["mcpServers"]["d2k"]

    async def go():
        params = StdioServerParameters(command=spec["command"], args=spec["args"], env={**os.environ, **spec["env"]})
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            names = sorted(t.name for t in (await s.list_tools()).tools)
            res = await s.call_tool("profile", {})
            return names, res.content[0].text

    names, text = asyncio.run(asyncio.wait_for(go(), 180))
    assert names == ["bench", "profile", "submit", "test"]
    assert "NotImplementedError" in text


def test_snapshot_is_content_hashed_and_a_modified_snapshot_is_rejected(tmp_path, task):
    ws = stage_workspace(task, tmp_path / "ws", "none", device="cpu", run_dir=tmp_path / "control", runner=True)
    cfg = load_config(ws)
    (ws / "solution.py").write_text("# v1\n")
    r1 = snapshot(ws, cfg, note="one", turn=4)
    (ws / "solution.py").write_text("# v2\n")  # editing after submission changes nothing
    r2 = snapshot(ws, cfg, turn=5)
    assert (r1.n, r2.n) == (1, 2) and r1.sha256 != r2.sha256
    assert Path(r1.snapshot).read_text() == "# v1\n" and r1.turn == 4 and r1.note == "one"
    assert Path(r1.snapshot).name.startswith("001-" + r1.sha256[:12])
    p = Path(r1.snapshot)
    p.chmod(0o644)
    p.write_text("# forged\n")
    res, ev = evaluate_request(cfg, r1)
    assert res.status == "rejected" and "modified" in res.text and ev is None
    # a forged request naming a file other than the tool's snapshot is rejected as well
    other = tmp_path / "elsewhere.py"
    other.write_text("# v1\n")
    forged = r2.model_copy(update={"snapshot": str(other), "sha256": sha256_of(other)})
    res, _ = evaluate_request(cfg, forged)
    assert res.status == "rejected" and "not the one the submit tool made" in res.text
    # the queue records the rejection as a candidate row and a trajectory event
    from d2kbench.store import Store

    store_path = tmp_path / "s.sqlite"
    st = Store(store_path)
    st.start_run("r1", task=TASK, model="m", backend="openai", guidance="none", seed=0, budget_turns=5, config={})
    q = SubmissionQueue(ws, store_path, "r1")
    out = q.process(r1)
    assert out.status == "rejected" and out.candidate_id is not None
    (cand,) = st.candidates_of("r1")
    assert cand["status"] == "rejected" and not cand["eligible"] and cand["turn"] == 4
    assert json.loads(st.events_of("r1", "candidate")[0]["data_json"])["status"] == "rejected"
    assert json.loads((tmp_path / "control" / "submissions" / "001.result.json").read_text())["status"] == "rejected"


def test_the_queue_evaluates_screens_and_records_its_own_copy(tmp_path, task, monkeypatch):
    """The agent can write its snapshot folder: swapping a submitted held-back copy for harmless
    code while it is evaluated must not get it past the held-back screen, and the recorded
    candidate is what was evaluated."""
    from d2kbench.agents import submissions
    from d2kbench.store import Store

    ws = stage_workspace(task, tmp_path / "ws", "none", device="cpu", run_dir=tmp_path / "run" / "control",
                         runner=True)
    copy = (task.root / "solutions" / "straightforward.py").read_text()
    (ws / "solution.py").write_text(copy)
    req = snapshot(ws, load_config(ws), turn=1)
    evaluated = []

    def evaluate(cfg, r, store=None, cand_dir=None):  # the agent edits its snapshot mid-evaluation
        agent_side = Path(req.snapshot)
        agent_side.chmod(0o644)
        agent_side.write_text("def run(G, steps=5):\n    return G\n")
        evaluated.append(Path(r.snapshot).read_text())
        return submissions.SubmissionResult(n=r.n, status="evaluated", eligible=True, geomean_speedup=2.0,
                                            sha256=r.sha256, text="ok"), None

    monkeypatch.setattr(submissions, "evaluate_request", evaluate)
    store_path = tmp_path / "s.sqlite"
    st = Store(store_path)
    st.start_run("r1", task=TASK, model="m", backend="openai", guidance="none", seed=0, budget_turns=5, config={})
    out = SubmissionQueue(ws, store_path, "r1").process(req)
    assert evaluated == [copy]
    assert (out.status, out.eligible) == ("held_back_copy", False)
    (cand,) = st.candidates_of("r1")
    assert Path(cand["path"]).read_text() == copy and sha256_of(Path(cand["path"])) == cand["solution_sha256"]
    assert Path(cand["path"]).parent == tmp_path / "run" / "candidates-evaluated"


def test_copies_of_held_back_solutions_are_recognised_through_cosmetic_edits(tmp_path, task):
    original = (task.root / "solutions" / "straightforward.py").read_text()
    cosmetic = ('"""My own work."""\n# written from scratch\n' + original.replace("\n\n\n", "\n\n")
                .replace('"""Muon orthogonalisation', '"""Orthogonalisation').replace("\n\n", "\n  # :)\n\n"))
    p = tmp_path / "c.py"
    p.write_text(cosmetic)
    assert held_back_copies(task.root, p) == [{"file": "straightforward.py", "similarity": 1.0, "identical": True}]
    # renamed names and an edited line: still a copy, by similarity
    p.write_text(original.replace("COEFFS)", "COEFFS[:4])").replace("polar_express", "my_polar"))
    (hit,) = held_back_copies(task.root, p)
    assert hit["file"] == "straightforward.py" and not hit["identical"] and hit["similarity"] >= COPY_THRESHOLD
    # an independent implementation of the same task is not a copy of either solution
    p.write_text((EVIL_DIR / "muon_newton_schulz" / "_tiny_muon.py").read_text())
    assert held_back_copies(task.root, p) == []
    assert code_fingerprint("x = 1  # a\n") == code_fingerprint("x = 1\n\n")
    assert code_fingerprint("x = 1\n") != code_fingerprint("x = 2\n")


