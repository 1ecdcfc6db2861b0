"""Task schema, loader and ``validate``: valid folders pass, malformed files name file, field, problem."""

from __future__ import annotations

import shutil

import pytest
import yaml

from d2kbench.harness.validate import validate_task
from d2kbench.tasks import TaskFileError, list_tasks, load_task
from d2kbench.tasks.formula import FormulaError, evaluate_formula, formula_names


@pytest.fixture
def task_copy(tmp_path, muon):
    dst = tmp_path / "muon_newton_schulz"
    shutil.copytree(muon.root, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def _edit_yaml(path, fn):
    data = yaml.safe_load(path.read_text())
    fn(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_registry_lists_muon():
    assert "muon_newton_schulz" in list_tasks()


def test_muon_spec_matches_spec_md(muon):
    s = muon.spec
    assert [(w.id, w.axes) for w in s.workloads if not w.correctness_only] == [
        ("paper_32x2048x5464", {"B": 32, "M": 2048, "N": 5464}),
        ("paper_32x4096x11008", {"B": 32, "M": 4096, "N": 11008}),
        ("paper_8x7168x18432", {"B": 8, "M": 7168, "N": 18432}),
    ]
    assert s.outputs[0].dtype == "bfloat16" and s.timing.mode == "events"
    assert {w.params.get("variant") for w in s.workloads if w.correctness_only} == {"low_rank_noise", "ill_conditioned"}


def test_shipped_tasks_validate():
    for tid in list_tasks():  # torch.compile alternatives take a minute cold: tests/test_alternatives.py runs some
        assert validate_task(tid, run_alternatives=False) == [], tid


def test_reference_rejects_wrong_steps(muon):
    ref = muon.reference_module()
    G = ref.make_inputs({"B": 1, "M": 8, "N": 16}, 0, "cpu")["G"]
    with pytest.raises(ValueError, match="steps must equal 5"):
        ref.run(G, 4)


def test_missing_field_names_file_and_field(task_copy):
    _edit_yaml(task_copy / "task.yaml", lambda d: d.pop("timing"))
    with pytest.raises(TaskFileError) as e:
        load_task(task_copy)
    assert str(task_copy / "task.yaml") in str(e.value) and "timing: Field required" in str(e.value)


def test_bad_tolerance_names_nested_field(task_copy):
    _edit_yaml(task_copy / "task.yaml", lambda d: d["outputs"][0]["checks"][0].pop("max"))
    with pytest.raises(TaskFileError, match=r"outputs\.0\.checks\.0.*rel_fro needs 'max'"):
        load_task(task_copy)


def test_unknown_key_is_rejected(task_copy):
    _edit_yaml(task_copy / "task.yaml", lambda d: d.update(timming={"mode": "events"}))
    with pytest.raises(TaskFileError, match="timming: Extra inputs are not permitted"):
        load_task(task_copy)


def test_workload_axes_must_match_arguments(task_copy):
    _edit_yaml(task_copy / "task.yaml", lambda d: d["smoke_workloads"][0]["axes"].pop("N"))
    with pytest.raises(TaskFileError, match="smoke_wide_2x32x96.*gives axes"):
        load_task(task_copy)


@pytest.mark.parametrize("value,problem", [(-4, "cannot be negative"), (0, "must be >= 1")])
def test_axis_values_must_be_sizes(task_copy, value, problem):
    _edit_yaml(task_copy / "task.yaml", lambda d: d["smoke_workloads"][0]["axes"].update(M=value))
    with pytest.raises(TaskFileError, match=f"task 'muon_newton_schulz': workload 'smoke_wide_2x32x96': "
                                            f"axis 'M' = {value}: .*{problem}"):
        load_task(task_copy)


def test_empty_axes_allow_zero_and_must_name_axes(task_copy):
    def zero(d):
        d["empty_axes"] = ["B"]
        d["smoke_workloads"][0]["axes"]["B"] = 0
    _edit_yaml(task_copy / "task.yaml", zero)
    assert load_task(task_copy).spec.smoke_workloads[0].axes["B"] == 0
    _edit_yaml(task_copy / "task.yaml", lambda d: d.update(empty_axes=["Q"]))
    with pytest.raises(TaskFileError, match=r"empty_axes names \['Q'\]"):
        load_task(task_copy)


def test_output_layout_must_be_sizes_on_every_workload(task_copy):
    _edit_yaml(task_copy / "task.yaml", lambda d: d["outputs"][0].update(strides=["M * N", "N", "1 - N // 2"]))
    with pytest.raises(TaskFileError, match=r"workload '\w+': output 'out' strides entry '1 - N // 2' = -\d+"):
        load_task(task_copy)


def test_sol_formula_with_unknown_name(task_copy):
    _edit_yaml(task_copy / "task.yaml", lambda d: d["sol"]["reference"].update(bytes="4 * B * M * K"))
    with pytest.raises(TaskFileError, match=r"sol reference.bytes uses unknown names \['K'\]"):
        load_task(task_copy)


def test_invalid_yaml(task_copy):
    (task_copy / "task.yaml").write_text("id: [unclosed\n")
    with pytest.raises(TaskFileError, match="not valid YAML"):
        load_task(task_copy)


def test_guidance_dependency_must_resolve(task_copy):
    _edit_yaml(task_copy / "guidance.yaml", lambda d: d["items"][0].update(depends_on=["nope"]))
    problems = validate_task(task_copy, run_smoke=False)
    assert any("guidance.yaml" in p and "unknown id 'nope'" in p for p in problems), problems


def test_guidance_cannot_depend_on_later_level(task_copy):
    _edit_yaml(task_copy / "guidance.yaml", lambda d: d["items"][0].update(depends_on=["symmetric_products"]))
    problems = validate_task(task_copy, run_smoke=False)
    assert any("of a later level" in p for p in problems), problems


def test_rubric_must_cover_all_levels(task_copy):
    _edit_yaml(task_copy / "rubric.yaml", lambda d: d.pop("L3"))
    problems = validate_task(task_copy, run_smoke=False)
    assert any("rubric.yaml" in p and "L3: Field required" in p for p in problems), problems


def test_template_signature_must_equal_reference(task_copy):
    tpl = task_copy / "template.py"
    tpl.write_text(tpl.read_text().replace("def run(G: torch.Tensor, steps: int = 5)",
                                           "def run(G: torch.Tensor, steps: int = 4)"))
    problems = validate_task(task_copy, run_smoke=False)
    assert any("template.py: run: signature" in p for p in problems), problems


def test_smoke_workload_must_run(task_copy):
    ref = task_copy / "reference.py"
    ref.write_text(ref.read_text().replace('return {"G": G.to(torch.bfloat16).contiguous(), "steps": NUM_STEPS}',
                                           'return {"G": G.to(torch.float16).contiguous(), "steps": NUM_STEPS}'))
    problems = validate_task(task_copy)
    assert any("smoke workload smoke_wide_2x32x96" in p and "dtype torch.float16, expected bfloat16" in p
               for p in problems), problems


def test_missing_expert_is_reported(task_copy):
    (task_copy / "solutions" / "expert.py").unlink(missing_ok=True)
    assert any("expert.py: file is missing" in p for p in validate_task(task_copy, run_smoke=False))


def test_guidance_levels_are_cumulative(muon):
    g = muon.guidance
    assert g.up_to("none") == []
    assert {i.level for i in g.up_to("L1")} == {"L1"}
    assert {i.level for i in g.up_to("L2")} == {"L1", "L2"}
    assert len(g.up_to("L3")) == len(g.items)


def test_formulas():
    assert evaluate_formula("B * (20 * min(M, N)**2 * max(M, N))", {"B": 2, "M": 3, "N": 5}) == 2 * 20 * 9 * 5
    assert formula_names("2 * ceil(M / 64) * N") == {"M", "N"}
    with pytest.raises(FormulaError, match="forbidden element"):
        evaluate_formula("__import__('os').system('true')", {})
    with pytest.raises(FormulaError, match="unknown name 'K'"):
        evaluate_formula("K * 2", {"M": 1})


@pytest.mark.parametrize("task_id,container,problem", [
    ("muon_newton_schulz", "Tensor", None), ("muon_newton_schulz", "tuple", "is returned bare"),
    ("muon_newton_schulz", "list", "is returned bare"),
    ("per_token_group_quant_fp8", "tuple", None), ("per_token_group_quant_fp8", "list", "(x_q, x_s) are returned as a tuple"),
    ("per_token_group_quant_fp8", "Tensor", "returned as a tuple"),
    ("kv_cache_fp8_store", "NoneType", None), ("kv_cache_fp8_store", "tuple", None),
    ("kv_cache_fp8_store", "list", "returns None"),
])
def test_output_container_follows_the_number_of_outputs(task_id, container, problem):
    spec = load_task(task_id).spec
    got = spec.container_problem(container)
    assert got is None if problem is None else problem in got, got
