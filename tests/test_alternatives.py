"""Alternatives (``task.yaml`` ``alternatives:``, ``alt:NAME``): what a user would run instead of
writing the kernel. Schema, resolution, trust (by path, never by name), correctness checks like any
solution, and runs through eval, bench and validate on the CPU smoke workloads."""

from __future__ import annotations

import shutil

import pytest
import yaml
from typer.testing import CliRunner

from d2kbench.cli import app
from d2kbench.harness.evaluate import Options, evaluate
from d2kbench.harness.validate import validate_task
from d2kbench.integrity.parent import make_guards
from d2kbench.results import Status
from d2kbench.tasks import TaskFileError, load_task
from d2kbench.tasks.loader import COMPILED_REFERENCE

#: A muon alternative with the right signature, shape and dtype but a wrong answer (G normalised,
#: not orthogonalised).
WRONG = '''import torch


def run(G: torch.Tensor, steps: int = 5) -> torch.Tensor:
    x = G.float()
    return (x / x.norm(dim=(-2, -1), keepdim=True)).to(torch.bfloat16)
'''


def _copy(tmp_path, task_id: str, alternatives: list[dict] | None = None, files: dict[str, str] | None = None):
    """A copy of a shipped task folder; ``alternatives`` replaces its list, ``files`` adds files."""
    dst = tmp_path / task_id
    shutil.copytree(load_task(task_id).root, dst, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, text in (files or {}).items():
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        (dst / rel).write_text(text)
    if alternatives is not None:
        data = yaml.safe_load((dst / "task.yaml").read_text())
        data["alternatives"] = alternatives
        (dst / "task.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return dst


def _on_cpu(tmp_path, task_id: str):
    """A copy of ``task_id`` whose alternatives also declare the CPU (their CPU stand-in path)."""
    alts = [{**a.model_dump(exclude_none=True), "devices": ["cpu", "cuda"]} for a in load_task(task_id).spec.alternatives]
    return load_task(_copy(tmp_path, task_id, alts))


# ------------------------------------------------------------------------------------------ schema
def test_shipped_alternatives():
    assert set(load_task("gqa_flash_prefill").alternatives()) == {"alt:sdpa_flash", "alt:sdpa_cudnn"}
    assert set(load_task("paged_decode_gqa").alternatives()) == {"alt:sdpa_efficient", "alt:sdpa_cudnn"}
    for tid in ("kv_cache_fp8_store", "moe_align_block_size", "fused_moe_bf16", "per_token_group_quant_fp8",
                "muon_newton_schulz"):
        assert load_task(tid).alternatives() == {"alt:torch_compile": COMPILED_REFERENCE}, tid
    assert load_task("gqa_flash_prefill").spec.alternative("sdpa_flash").devices == ["cuda"]


@pytest.mark.parametrize("alt, match", [
    ({"name": "SDPA-flash", "description": "x", "compile_reference": True}, r"alternatives\.0\.name.*snake_case"),
    ({"name": "a", "description": "x", "file": "alternatives/nope.py"},
     r"alternatives\.0\.file: alternatives/nope\.py does not exist"),
    ({"name": "a", "description": "x", "file": "alternatives/a.py", "compile_reference": True}, "exactly one of 'file'"),
    ({"name": "a", "description": "x"}, "exactly one of 'file'"),
    ({"name": "a", "description": "x", "compile_reference": True, "devices": ["tpu"]}, r"alternatives\.0\.devices\.0"),
    ({"name": "a", "description": "", "compile_reference": True}, "one-line description"),
    ({"name": "a", "description": "x", "file": "../reference.py"}, "inside it"),
    ({"name": "a", "description": "x", "compile_reference": True, "extra": 1}, r"alternatives\.0\.extra"),
])
def test_schema_rejects_bad_alternatives(tmp_path, alt, match):
    root = _copy(tmp_path, "muon_newton_schulz", [alt], {"alternatives/a.py": WRONG})
    with pytest.raises(TaskFileError, match=match) as e:
        load_task(root)
    assert str(root / "task.yaml") in str(e.value)


def test_schema_rejects_duplicates(tmp_path):
    twice = [{"name": "c", "description": "x", "compile_reference": True}, {"name": "d", "description": "y",
                                                                            "compile_reference": True}]
    with pytest.raises(TaskFileError, match="at most one alternative may set compile_reference"):
        load_task(_copy(tmp_path / "1", "muon_newton_schulz", twice))
    same = [{"name": "c", "description": "x", "compile_reference": True}] * 2
    with pytest.raises(TaskFileError, match="duplicate alternative names"):
        load_task(_copy(tmp_path / "2", "muon_newton_schulz", same))


# -------------------------------------------------------------------------------- resolution, trust
def test_resolution_and_devices():
    gqa = load_task("gqa_flash_prefill")
    assert gqa.resolve_solution("alt:sdpa_flash") == gqa.root / "alternatives" / "sdpa_flash.py"
    assert gqa.resolve_solution("alt:sdpa_flash", "cuda") == gqa.root / "alternatives" / "sdpa_flash.py"
    with pytest.raises(ValueError, match="runs on cuda only, not on cpu"):
        gqa.resolve_solution("alt:sdpa_flash", "cpu")
    with pytest.raises(FileNotFoundError, match="no alternative 'nope' .*known: sdpa_flash, sdpa_cudnn"):
        gqa.resolve_solution("alt:nope")
    assert "alt:sdpa_flash" not in gqa.solutions()  # alternatives are not solutions (integrity tests iterate those)
    muon = load_task("muon_newton_schulz")
    assert muon.resolve_solution("alt:torch_compile", "cpu") == COMPILED_REFERENCE


def test_store_identity_of_alternatives():
    muon, moe = load_task("muon_newton_schulz"), load_task("moe_align_block_size")
    compiled = [t.solution_sha256(COMPILED_REFERENCE) for t in (muon, moe)]
    assert compiled[0] != compiled[1]  # same harness file, different references: different comparators
    gqa = load_task("gqa_flash_prefill")
    assert len({gqa.solution_sha256(p) for p in gqa.alternatives().values()}) == 2


def test_trust_is_by_path_not_by_name(tmp_path):
    gqa = load_task("gqa_flash_prefill")
    assert gqa.is_trusted(gqa.root / "reference.py")
    assert all(gqa.is_trusted(p) for p in gqa.alternatives().values())
    assert not gqa.is_trusted(gqa.solutions()["expert"])
    assert not gqa.is_trusted(COMPILED_REFERENCE)  # gqa declares no compile_reference alternative
    assert load_task("muon_newton_schulz").is_trusted(COMPILED_REFERENCE)
    # the same SDPA code under the same names, placed elsewhere: untrusted, and the rules flag it
    fake = tmp_path / "alternatives" / "sdpa_flash.py"
    fake.parent.mkdir()
    fake.write_text((gqa.root / "alternatives" / "sdpa_flash.py").read_text())
    assert not gqa.is_trusted(fake)
    guards = make_guards(gqa, {"alt:sdpa_flash": fake, "real": gqa.resolve_solution("alt:sdpa_flash")}, "cpu")
    assert not guards["alt:sdpa_flash"].trusted and guards["alt:sdpa_flash"].static
    assert guards["real"].trusted and not guards["real"].static


def test_sdpa_outside_the_task_is_an_integrity_violation(tmp_path):
    gqa = load_task("gqa_flash_prefill")
    fake = tmp_path / "sdpa_flash.py"
    fake.write_text((gqa.root / "alternatives" / "sdpa_flash.py").read_text())
    ev = evaluate(gqa, fake, [gqa.spec.smoke_workloads[1]], "cpu", None,
                  options=Options(timeout_s=120, time_solutions=False))
    assert ev.candidate.results[0].status is Status.INTEGRITY_VIOLATION, ev.candidate.results[0].cause


# ------------------------------------------------------------------------------- checked and timed
def test_wrong_alternative_is_incorrect(tmp_path):
    alts = [{"name": "wrong", "description": "the reference times 1.5", "file": "alternatives/wrong.py",
             "devices": ["cpu"]}]
    task = load_task(_copy(tmp_path, "muon_newton_schulz", alts, {"alternatives/wrong.py": WRONG}))
    assert task.is_trusted(task.root / "alternatives" / "wrong.py")
    ev = evaluate(task, "alt:wrong", [task.spec.workload("smoke_tall_1x64x48")], "cpu", None,
                  options=Options(timeout_s=120, time_solutions=False))
    r = ev.candidate.results[0]
    assert ev.candidate.solution == "alt:wrong"
    assert r.status is Status.INCORRECT and "rel_fro" in r.cause, r.cause
    problems = validate_task(task.root)
    assert any("alternatives.0 (wrong): smoke workload" in p and "rel_fro" in p for p in problems), problems


@pytest.mark.parametrize("task_id", ["gqa_flash_prefill", "paged_decode_gqa"])
def test_sdpa_alternatives_match_the_reference_on_cpu(tmp_path, task_id):
    """The CUDA-only SDPA alternatives' layout, LSE, gather and mask logic, through the harness's
    checks on every smoke workload, with the CPU stand-in of the backend (see their docstrings)."""
    task = _on_cpu(tmp_path, task_id)
    for alt in task.alternatives():
        ev = evaluate(task, alt, None, "cpu", None, options=Options(timeout_s=120, time_solutions=False))
        assert [r.status for r in ev.candidate.results] == [Status.OK] * len(task.spec.smoke_workloads), \
            (alt, [r.cause for r in ev.candidate.results])


@pytest.mark.slow
def test_bench_with_torch_compile_alternative(tmp_path):
    md, store = tmp_path / "b.md", tmp_path / "s.sqlite"
    r = CliRunner().invoke(app, ["bench", "per_token_group_quant_fp8", "-s", "alt:torch_compile", "--baseline",
                                 "reference", "--device", "cpu", "-w", "smoke_m37_k512", "--markdown", str(md),
                                 "--store", str(store), "--bar", "alt:torch_compile/reference>=0"],
                           env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    page = md.read_text()
    assert "## Alternatives" in page and "| alt:torch_compile | torch.compile (default mode)" in page
    assert "| smoke_m37_k512 |" in page and "alt:torch_compile / reference" in page
    r = CliRunner().invoke(app, ["results", "--store", str(store), "--solution", "alt:torch_compile"],
                           env={"COLUMNS": "250"})
    assert r.exit_code == 0 and "alt:torch_compile" in r.output and "ok" in r.output


def test_cli_refuses_an_alternative_off_its_devices():
    r = CliRunner().invoke(app, ["eval", "gqa_flash_prefill", "alt:sdpa_flash", "--device", "cpu"])
    assert r.exit_code == 2 and "runs on cuda only" in r.output


def test_show_lists_alternatives():
    r = CliRunner().invoke(app, ["show", "paged_decode_gqa"], env={"COLUMNS": "250"})
    assert r.exit_code == 0 and "alt:sdpa_efficient" in r.output and "alt:sdpa_cudnn" in r.output


@pytest.mark.slow
@pytest.mark.parametrize("task_id", ["per_token_group_quant_fp8", "kv_cache_fp8_store"])
def test_validate_runs_torch_compile_alternatives(task_id):
    assert validate_task(task_id, run_alternatives=True) == []


def test_validate_checks_alternative_signatures(tmp_path):
    alts = [{"name": "bad_sig", "description": "x", "file": "alternatives/bad.py", "devices": ["cuda"]}]
    root = _copy(tmp_path, "muon_newton_schulz", alts, {"alternatives/bad.py": "def run(G, steps=4):\n    return G\n"})
    problems = validate_task(root, run_smoke=False)
    assert any("alternatives.0 (bad_sig): run: signature" in p for p in problems), problems
