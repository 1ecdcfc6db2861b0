"""The published schemas, the strict provider schemas, design validation and verdict parsing."""

from __future__ import annotations

import copy
import json

import pytest
from test_judge_support import design_fixture, zero_verdict

from d2kbench.judge.design_schema import MAX_DESIGN_CHARS, ModelDesign, design_leaves, validate_design
from d2kbench.judge.jsonschemas import SCHEMA_DIR, inline_refs, provider_schema, stale_published, strict_problems
from d2kbench.judge.verdict import DesignVerdict, ImplVerdict, MalformedVerdict, parse_verdict


def test_published_schema_files_match_the_models():
    assert stale_published() == [], "run: python -m d2kbench.judge.jsonschemas"
    assert (SCHEMA_DIR / "model_design.schema.json").is_file()


def test_published_design_schema_accepts_the_fixture_and_rejects_a_broken_one():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((SCHEMA_DIR / "model_design.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(design_fixture(), schema)
    bad = design_fixture()
    del bad["L3"][0]["pitfalls"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


@pytest.mark.parametrize("model", [ImplVerdict, DesignVerdict])
def test_verdict_schemas_are_strict_and_self_contained(model):
    schema = provider_schema(model, strict=True)
    assert strict_problems(schema) == []
    assert "$ref" not in json.dumps(schema) and "$defs" not in schema
    level = schema["properties"]["L1"]
    assert list(level["properties"])[0] == "evidence", "evidence comes before the score"
    assert level["properties"]["score"] == {"description": level["properties"]["score"]["description"],
                                            "maximum": 100, "minimum": 0, "type": "number"}


def test_strict_problems_finds_open_objects_and_optional_fields():
    schema = {"type": "object", "properties": {"a": {"type": "string", "minLength": 1}, "b": {}}, "required": ["a"]}
    problems = strict_problems(schema)
    assert "/: additionalProperties must be false" in problems
    assert "/: properties not required: b" in problems
    assert "/properties/a: keyword minLength is not accepted by every strict mode" in problems
    assert "/properties/b: no type" in problems


def test_inline_refs_rejects_unknown_references():
    with pytest.raises(ValueError, match="unknown reference"):
        inline_refs({"properties": {"x": {"$ref": "#/$defs/Nope"}}, "$defs": {}})


def test_design_fixture_is_valid_and_its_leaves_are_addressed_by_pointer():
    design, problems = validate_design(design_fixture(), "muon_newton_schulz")
    assert problems == [] and isinstance(design, ModelDesign)
    leaves = design_leaves(design_fixture())
    assert leaves["/L1/0/causal_chain/bottleneck"].startswith("At 32 x 4096 x 11008")
    assert leaves["/dataflow/edges/1/source"] == "segment"


def test_design_errors_name_every_field():
    bad = design_fixture()
    bad["L1"][0]["causal_chain"].pop("cost_reduction")
    bad["L2"][0]["conditions"] = []
    bad["L3"][1]["serves"] = ["no_such_entry"]
    bad["L2"][1]["builds_on"] = ["segment_buffers"]
    bad["dataflow"]["edges"][0]["target"] = "nowhere"
    bad["extra"] = 1
    design, problems = validate_design(bad, "muon_newton_schulz")
    assert design is None
    text = "\n".join(problems)
    assert "/L1/0/causal_chain/cost_reduction: Field required" in text
    assert "/L2/0/conditions: List should have at least 1 item" in text
    assert "/extra: Extra inputs are not permitted" in text
    # cross-references are checked once the fields are well-formed
    bad2 = design_fixture()
    bad2["L3"][1]["serves"] = ["no_such_entry"]
    bad2["L2"][1]["builds_on"] = ["segment_buffers"]
    bad2["dataflow"]["edges"][0]["target"] = "nowhere"
    bad2["L2"][1]["id"] = "gram_side"
    _, problems2 = validate_design(bad2, "muon_newton_schulz")
    assert "/L3/1/serves: 'no_such_entry' is not the id of an L1 or L2 entry" in problems2
    assert "/L2/1/builds_on: 'segment_buffers' is not the id of an L1 entry" in problems2
    assert "/dataflow/edges/0/target: 'nowhere' is not a stage id" in problems2
    assert any("ids must be unique" in p and "gram_side" in p for p in problems2)


def test_design_for_another_task_or_not_json_or_too_long_fails():
    assert validate_design(design_fixture(), "gqa_flash_prefill")[1] == [
        "/task: the design is for task 'muon_newton_schulz', this run's task is 'gqa_flash_prefill'"]
    assert validate_design("{not json", None)[1][0].startswith("(top level): not valid JSON")
    assert validate_design([1, 2], None)[1] == ["(top level): the design must be a JSON object, got list"]
    big = copy.deepcopy(design_fixture())
    big["summary"] = "x" * 4000
    big["L1"] = big["L1"] * 60
    assert f"at most {MAX_DESIGN_CHARS}" in validate_design(big, None)[1][0]


def test_parse_verdict_names_the_cause():
    v = parse_verdict("impl", zero_verdict())
    assert isinstance(v, ImplVerdict) and v.L2.missing[0] == "x_fixed_in_segment"
    with pytest.raises(MalformedVerdict, match="not valid JSON"):
        parse_verdict("impl", "{oops")
    bad = zero_verdict()
    bad["L2"]["score"] = 140
    bad["L3"]["evidence"] = [{"file": "solution.py", "start_line": "ten", "end_line": 3, "supports": "x"}]
    del bad["summary"]
    with pytest.raises(MalformedVerdict) as e:
        parse_verdict("impl", bad)
    assert "/L2/score: Input should be less than or equal to 100" in e.value.problems
    assert "/L3/evidence/0/start_line: Input should be a valid integer, unable to parse string as an integer" \
        in e.value.problems
    assert "/summary: Field required" in e.value.problems
    with pytest.raises(MalformedVerdict, match="/L1/evidence/0/quote: Field required"):
        d = zero_verdict()
        d["L1"]["evidence"] = [{"supports": "q_composition"}]
        parse_verdict("design", d)


def test_every_rubric_level_can_be_fully_evidenced():
    """Every realised property needs its own evidence item and a level allows at most
    MAX_EVIDENCE items, so a rubric level may hold at most that many properties."""
    from d2kbench.judge.evidence import MAX_EVIDENCE
    from d2kbench.tasks import list_tasks, load_task

    for tid in list_tasks():
        rubric = load_task(tid).rubric
        for lvl in ("L1", "L2", "L3"):
            ids = [p.id for p in getattr(rubric, lvl).properties]
            assert len(ids) <= MAX_EVIDENCE, f"{tid} {lvl}: {len(ids)} properties"
            assert len(set(ids)) == len(ids), f"{tid} {lvl}: repeated property ids"


def test_prompts_render_for_every_task_and_name_every_property():
    from d2kbench.judge.prompts import design_prompt, impl_prompt, load_prompt
    from d2kbench.judge.sourcelines import SourceFile
    from d2kbench.tasks import list_tasks, load_task

    for name in ("judge_system", "judge_impl", "judge_design", "judge_repair", "design_agent_system",
                 "design_agent_task"):
        assert load_prompt(name).version
    for tid in list_tasks():
        task = load_task(tid)
        cand = SourceFile("solution.py", (task.root / "template.py").read_text())
        prompts = [impl_prompt(task, cand, "# expert"), design_prompt(task, design_fixture())]
        ids = [p.id for lvl in ("L1", "L2", "L3") for p in getattr(task.rubric, lvl).properties]
        for p in prompts:
            assert "${" not in p.user and all(f"`{i}`" in p.user for i in ids), tid
