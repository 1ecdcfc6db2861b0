"""Evidence verification on real files: valid evidence passes, every kind of invalid evidence
fails with a message that names the cause."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_judge_support import (
    PROPERTIES,
    cite,
    design_fixture,
    expert_path,
    expert_property_lines,
    level,
    quote,
    straightforward_path,
    text_line,
)

from d2kbench.judge.design_schema import design_leaves
from d2kbench.judge.evidence import (
    MIN_QUOTE_CHARS,
    check_citation,
    normalize_quote,
    normalize_text,
    verify_design_level,
    verify_impl_level,
)
from d2kbench.judge.prompts import criteria_texts
from d2kbench.judge.sourcelines import BLANK, CODE, COMMENT, DOCSTRING, SourceFile, classify_lines, numbered_listing
from d2kbench.judge.verdict import CodeCitation, DesignLevel, DesignQuote, ImplLevel
from d2kbench.tasks import load_task


@pytest.fixture(scope="module")
def expert() -> SourceFile:
    return SourceFile("solution.py", expert_path().read_text())


@pytest.fixture(scope="module")
def files(expert):
    return {"solution.py": expert}


def impl(lvl: str, evidence, realised=None, score=70.0) -> ImplLevel:
    props = PROPERTIES[lvl]
    realised = props if realised is None else realised
    return ImplLevel.model_validate(level(evidence, realised, [p for p in props if p not in realised], score))


# ---- line classification ------------------------------------------------------------------------

def test_classify_lines_tokens_and_docstrings():
    src = ('"""Module doc\n\nmore."""\nimport os  # trailing\n\n# alone\ndef f(x):\n    """Doc."""\n'
           '    y = (1,\n         # inside\n         2)\n    s = """a\nb"""\n    "stray string"\n    return y\n')
    assert classify_lines(src) == [DOCSTRING, DOCSTRING, DOCSTRING, CODE, BLANK, COMMENT, CODE, DOCSTRING, CODE,
                                   COMMENT, CODE, CODE, CODE, DOCSTRING, CODE]


def test_listing_numbers_match_the_tokenizer():
    text = "a = 1\r\nb = 2\n# c\n"
    assert numbered_listing(text) == "   1\ta = 1\n   2\tb = 2\n   3\t# c"
    assert classify_lines(text) == [CODE, CODE, COMMENT]


# ---- code citations -----------------------------------------------------------------------------

def test_expert_real_lines_verify_for_every_property(files):
    lines = expert_property_lines()
    for lvl, props in PROPERTIES.items():
        ev = [cite(a, b, p) for p in props for a, b in lines[p]]
        check = verify_impl_level(lvl, impl(lvl, ev), props, files)
        assert check.ok, check.errors
        assert all(loc and loc.startswith("lines ") for loc in check.located)


@pytest.mark.parametrize("start,end,why", [
    (0, 3, "not a valid inclusive range"),
    (5, 4, "not a valid inclusive range"),
    (10_000, 10_001, "not a valid inclusive range"),
])
def test_out_of_range_lines_fail(files, start, end, why):
    assert why in check_citation(CodeCitation.model_validate(cite(start, end, "q_composition")), files)


def test_range_past_the_last_line_fails(files, expert):
    n = len(expert.lines)
    assert "not a valid inclusive range" in check_citation(CodeCitation(code="", file="solution.py", start_line=n - 1,
                                                                        end_line=n + 1, supports="x"), files)


def test_a_comment_line_fails(files):
    k = text_line(expert_path(), "# P = a I + b A + c A^2")
    msg = check_citation(CodeCitation(code="", file="solution.py", start_line=k, end_line=k, supports="q_composition"), files)
    assert f"line {k} is a comment" in msg


def test_a_docstring_fails(files):
    k = text_line(expert_path(), "L1 -- Gram form with one fixed restart")
    msg = check_citation(CodeCitation(code="", file="solution.py", start_line=k, end_line=k + 3, supports="q_composition"),
                         files)
    assert "docstring" in msg


def test_a_range_that_swallows_a_docstring_fails(files):
    tree_start = text_line(expert_path(), "def _accumulate_state(")
    msg = check_citation(CodeCitation(code="", file="solution.py", start_line=tree_start, end_line=tree_start + 16,
                                      supports="q_composition"), files)
    assert "docstring" in msg


def test_a_blank_line_fails(files, expert):
    k = next(i for i, line in enumerate(expert.lines, 1) if not line.strip() and expert.kind(i) == BLANK)
    assert "blank" in check_citation(CodeCitation(code="", file="solution.py", start_line=k, end_line=k, supports="x"), files)


def test_a_range_padded_with_comments_fails():
    src = "x = 1\n" + "# note\n" * 6 + "y = 2\n"
    msg = check_citation(CodeCitation(code="", file="s.py", start_line=1, end_line=8, supports="p"),
                         {"s.py": SourceFile("s.py", src)})
    assert "only 2 of 8 lines are executable" in msg


def test_a_range_too_long_fails(files):
    assert "at most 40" in check_citation(CodeCitation(code="", file="solution.py", start_line=100, end_line=160, supports="x"),
                                          files)


def test_a_file_that_was_not_judged_fails(files):
    assert "not a judged file" in check_citation(CodeCitation(code="", file="expert.py", start_line=70, end_line=70,
                                                              supports="x"), files)


def test_five_citations_fail(files):
    a, b = expert_property_lines()["q_composition"][0]
    ev = [cite(a, b, "q_composition")] * 2 + [cite(a, a, "q_composition")] + [cite(b, b, "fixed_restart")] * 2
    check = verify_impl_level("L1", impl("L1", ev), PROPERTIES["L1"], files)
    assert any("5 evidence items, at most 4" in e for e in check.errors)
    assert any("repeats evidence" in e for e in check.errors)


def test_property_bookkeeping(files):
    lines = expert_property_lines()
    (a, b), = lines["fp32_only_in_norm"]
    ev = [cite(a, b, "fp32_only_in_norm")]
    # realised property without its own evidence
    check = verify_impl_level("L2", impl("L2", ev, realised=["fp32_only_in_norm", "batched_fused_gemm"]),
                              PROPERTIES["L2"], files)
    assert check.errors == ["L2: realised properties without evidence: batched_fused_gemm"]
    # evidence for a property not claimed as realised; an unknown id; a property left unlisted
    bad = ImplLevel.model_validate(level([cite(a, b, "x_fixed_in_segment")], ["fp32_only_in_norm", "warp_spec"],
                                         ["batched_fused_gemm"], 50))
    errors = verify_impl_level("L2", bad, PROPERTIES["L2"], files).errors
    assert any("'warp_spec', not a property of L2" in e for e in errors)
    assert any("neither realised nor missing: x_fixed_in_segment" in e for e in errors)
    assert any("supports 'x_fixed_in_segment', which is not listed as realised" in e for e in errors)


def test_nonzero_score_needs_evidence_and_zero_needs_none(files):
    check = verify_impl_level("L3", impl("L3", [], score=10), PROPERTIES["L3"], files)
    assert any("without evidence" in e for e in check.errors)
    zero = ImplLevel.model_validate(level([], [], PROPERTIES["L3"], 0))
    assert verify_impl_level("L3", zero, PROPERTIES["L3"], files).ok


def test_straightforward_solution_lines():
    sf = {"solution.py": SourceFile("solution.py", straightforward_path().read_text())}
    k = text_line(straightforward_path(), "Bm = _bgemm(A, A, alpha=c, c=A, beta=b)")
    ok = impl("L2", [cite(k, k, "batched_fused_gemm", source=straightforward_path())], realised=["batched_fused_gemm"],
              score=40)
    assert verify_impl_level("L2", ok, PROPERTIES["L2"], sf).ok


# ---- design quotes ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def design_ctx():
    task = load_task("muon_newton_schulz")
    return design_leaves(design_fixture()), criteria_texts(task.guidance, task.rubric)


def design_level(lvl: str, quotes, realised=None, score=60.0) -> DesignLevel:
    props = PROPERTIES[lvl]
    realised = props if realised is None else realised
    return DesignLevel.model_validate(level(quotes, realised, [p for p in props if p not in realised], score))


def test_valid_quotes_pass_and_are_located(design_ctx):
    leaves, criteria = design_ctx
    lvl = design_level("L1", [quote("apply Q to X once per segment", "q_composition"),
                              quote("  After the first two coefficient triples commit X <- Q X in FP16 ",
                                    "fixed_restart")])
    check = verify_design_level("L1", lvl, PROPERTIES["L1"], leaves, criteria)
    assert check.ok, check.errors
    assert check.located == ["/L1/0/causal_chain/change", "/L1/1/causal_chain/change"]


def test_quote_normalisation_nfc_whitespace_and_marks(design_ctx):
    leaves, criteria = design_ctx
    decomposed = {"/x": unicodedata.normalize("NFC", "le caf\u00e9 est pr\u00eat pour tous")}
    q = DesignQuote(quote="\u201ccaf" + "e\u0301 est   pr\u00eat\npour\u201d", supports="p")
    lvl = DesignLevel(evidence=[q], realised=["p"], missing=[], rationale="r", score=10)
    assert verify_design_level("L1", lvl, ["p"], decomposed, {}).ok
    assert normalize_text("a \t\r\n b") == "a b"
    assert normalize_quote("'\"quoted\"'") == "quoted"


def test_paraphrase_fails(design_ctx):
    leaves, criteria = design_ctx
    lvl = design_level("L1", [quote("apply Q to the iterate once per segment", "q_composition"),
                              quote("commit X <- Q X in FP16 after the first two triples", "fixed_restart")])
    errors = verify_design_level("L1", lvl, PROPERTIES["L1"], leaves, criteria).errors
    assert len(errors) == 2 and all("not found verbatim" in e for e in errors)


def test_quote_taken_from_the_guidance_fails(design_ctx):
    leaves, criteria = design_ctx
    from_guidance = "In exact arithmetic the restart changes nothing; in FP16 it bounds the drift"
    assert from_guidance in criteria["guidance"]
    lvl = design_level("L1", [quote("apply Q to X once per segment", "q_composition"),
                              quote(from_guidance, "fixed_restart")])
    errors = verify_design_level("L1", lvl, PROPERTIES["L1"], leaves, criteria).errors
    assert errors == [f"L1 evidence 2: quote {from_guidance[:67] + '...'!r} is taken from the guidance, not from the "
                      "design"]


def test_quote_taken_from_the_rubric_fails(design_ctx):
    leaves, criteria = design_ctx
    from_rubric = "Credit requires the code to show where X stays fixed"
    lvl = design_level("L1", [quote(from_rubric, "q_composition")], realised=["q_composition"])
    errors = verify_design_level("L1", lvl, PROPERTIES["L1"], leaves, criteria).errors
    assert len(errors) == 1 and "taken from the rubric" in errors[0]


def test_short_quote_fails(design_ctx):
    leaves, criteria = design_ctx
    lvl = design_level("L3", [quote("triangle", "symmetric_triangle")], realised=["symmetric_triangle"])
    errors = verify_design_level("L3", lvl, PROPERTIES["L3"], leaves, criteria).errors
    assert errors == [f"L3 evidence 1: quote 'triangle' has 8 characters, at least {MIN_QUOTE_CHARS} are needed"]


def test_five_quotes_fail(design_ctx):
    leaves, criteria = design_ctx
    texts = ["Symmetric products computed over the upper-triangular tile list",
             "each off-diagonal tile stored at (i, j) and transposed at (j, i)",
             "Storing only one triangle breaks consumers",
             "Diagonal tiles must be written once, not twice.",
             "a grouped tile order for L2 reuse"]
    ev = [quote(t, "symmetric_triangle") for t in texts[:4]] + [quote(texts[4], "tuned_tiles")]
    errors = verify_design_level("L3", design_level("L3", ev), PROPERTIES["L3"], leaves, criteria).errors
    assert errors == ["L3: 5 evidence items, at most 4 are allowed"]


def test_spliced_quote_fails(design_ctx):
    leaves, criteria = design_ctx
    lvl = design_level("L3", [quote("Symmetric products computed ... transposed at (j, i)", "symmetric_triangle")],
                       realised=["symmetric_triangle"])
    errors = verify_design_level("L3", lvl, PROPERTIES["L3"], leaves, criteria).errors
    assert "looks spliced" in errors[0]


def test_a_quote_spanning_two_fields_fails(design_ctx):
    leaves, criteria = design_ctx
    lvl = design_level("L2", [quote("one launch per product for the whole batch. Applies to every product",
                                    "batched_fused_gemm")], realised=["batched_fused_gemm"])
    assert not verify_design_level("L2", lvl, PROPERTIES["L2"], leaves, criteria).ok


_FIELD = "Keep A, the step polynomial P and Q as M x M FP16 buffers; the rectangular X is only read to build R."


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_any_long_enough_substring_verifies_and_a_changed_character_fails(data):
    start = data.draw(st.integers(0, len(_FIELD) - MIN_QUOTE_CHARS))
    end = data.draw(st.integers(start + MIN_QUOTE_CHARS, len(_FIELD)))
    sub = _FIELD[start:end]
    leaves = {"/L2/0/change": _FIELD}

    def one(text: str) -> bool:
        lvl = DesignLevel(evidence=[DesignQuote(quote=text, supports="p")], realised=["p"], missing=[], rationale="r",
                          score=50)
        return verify_design_level("L2", lvl, ["p"], leaves, {}).ok

    if len(normalize_quote(sub)) >= MIN_QUOTE_CHARS:
        assert one(sub)
    i = data.draw(st.integers(0, len(sub) - 1))
    mutated = sub[:i] + ("#" if sub[i] != "#" else "%") + sub[i + 1:]
    assert not one(mutated)


def test_quote_of_the_task_description_is_named():
    task = load_task("muon_newton_schulz")
    criteria = {**criteria_texts(task.guidance, task.rubric), "task description": task.spec.description}
    q = "`steps` must equal 5: the coefficient sequence may not be shortened or repeated."
    lvl = DesignLevel(evidence=[DesignQuote(quote=q, supports="fixed_restart")], realised=["fixed_restart"],
                      missing=["q_composition"], rationale="r", score=5)
    errors = verify_design_level("L1", lvl, PROPERTIES["L1"], design_leaves(design_fixture()), criteria).errors
    assert len(errors) == 1 and "taken from the task description" in errors[0]
