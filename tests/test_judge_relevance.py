"""Implementation evidence must be relevant: the key code quoted inside each cited range must be
work that run() reaches. Fabricated citations that are executable but prove nothing (imports,
decorators, signatures, constants, drifted ranges, dead helpers) fail; the expert's genuine
citations pass."""

from __future__ import annotations

import pytest
from agents_fakes.fake_provider import FakeProvider
from test_judge_support import (
    PROPERTIES,
    cite,
    expert_path,
    expert_property_lines,
    expert_verdict,
    level,
    text_line,
    verdict,
)

from d2kbench.judge.evidence import MIN_CODE_CHARS, check_citation, verify_impl_level
from d2kbench.judge.runner import JudgeConfig, judge
from d2kbench.judge.sourcelines import (
    CONSTANT,
    DECORATOR,
    IMPORT,
    NOOP,
    SIGNATURE,
    WORK,
    SourceFile,
    line_roles,
    reachable_lines,
)
from d2kbench.judge.targets import impl_from_solution
from d2kbench.judge.verdict import CodeCitation, ImplLevel
from d2kbench.store import Store


@pytest.fixture(scope="module")
def files():
    return {"solution.py": SourceFile("solution.py", expert_path().read_text())}


def at(needle: str) -> int:
    return text_line(expert_path(), needle)


def one(start: int, end: int, code: str, files, supports: str = "q_composition") -> str | None:
    return check_citation(CodeCitation(file="solution.py", start_line=start, end_line=end, code=code,
                                       supports=supports), files)


def l1(evidence, score: float = 90.0) -> ImplLevel:
    return ImplLevel.model_validate(level(evidence, PROPERTIES["L1"], [], score))


# ---- line roles and reachability on hand-made sources ---------------------------------------------

SRC = '''import torch
from math import sqrt

BLOCK = 128
SCALE: float = 0.5
TABLE = {(1, 2): make(3)}


@decorate(
    configs=[1, 2],
)
def kernel(x, y,
           z):
    pass


def helper(x):
    return x * SCALE


def unused(x):
    return x @ x.T


def run(x):
    try:
        y = kernel(x, TABLE, 1)
    finally:
        y = x
    return helper(y)


torch.backends.flag = True
if __name__ == "__main__":
    unused(1)
'''


def test_line_roles_follow_the_innermost_statement():
    roles = line_roles(SRC)
    assert roles[0:2] == [IMPORT, IMPORT]
    assert roles[3:6] == [CONSTANT, CONSTANT, WORK]  # a literal, an annotated literal, a table built by calls
    assert roles[8:11] == [DECORATOR] * 3
    assert roles[11:13] == [SIGNATURE, SIGNATURE] and roles[13] == NOOP  # a two-line signature, pass
    assert roles[17] == WORK  # return x * SCALE
    assert roles[25] == NOOP and roles[26] == WORK and roles[27] == NOOP  # try:, the call, finally:


def test_reachable_lines_follow_names_from_run():
    reach = reachable_lines(SRC)
    lines = SRC.split("\n")
    names = {ln for ln in reach}

    def has(text: str) -> bool:
        return lines.index(text) + 1 in names

    assert has("def run(x):") and has("    return helper(y)") and has("    return x * SCALE")
    assert has("@decorate(") and has("    pass")  # kernel, with its decorator, is called by run
    assert has("TABLE = {(1, 2): make(3)}") and has("SCALE: float = 0.5")  # module-level bindings run reads
    assert has("torch.backends.flag = True")  # binds no name: runs at import
    assert not has("    return x @ x.T")  # unused: only the __main__ block calls it
    assert not has("    unused(1)") and not has("BLOCK = 128")
    assert reachable_lines("def f():\n    return 1\n") is None  # no run(): nothing ruled out


# ---- fabricated citations on the real expert --------------------------------------------------------

def test_the_reported_case_four_import_lines_fail_for_q_composition_and_fixed_restart(files):
    imports = [at("import functools"), at("import os"), at("import torch"), at("import triton.language as tl")]
    ev = [cite(imports[0], imports[0], "q_composition", code="import functools"),
          cite(imports[1], imports[1], "q_composition", code="import os"),
          cite(imports[2], imports[2], "fixed_restart", code="import torch"),
          cite(imports[3], imports[3], "fixed_restart", code="import triton.language as tl")]
    check = verify_impl_level("L1", l1(ev), PROPERTIES["L1"], files)
    assert len(check.errors) == 4 and all("only import lines" in e for e in check.errors)
    # with the key code left out altogether, the same citations fail too
    bare = [dict(e, code="") for e in ev]
    assert all(f"at least {MIN_CODE_CHARS} are needed" in e
               for e in verify_impl_level("L1", l1(bare), PROPERTIES["L1"], files).errors)


def test_decorators_signatures_and_constants_are_not_evidence(files):
    jit = at("@triton.jit")
    assert "only decorator lines" in one(jit, jit, "@triton.jit", files)
    lru = at("@functools.lru_cache(maxsize=64)")
    assert "only decorator lines" in one(lru, lru, "@functools.lru_cache(maxsize=64)", files)
    sig = at("def _accumulate_state(")
    assert "only signature lines" in one(sig, sig, "def _accumulate_state(P: torch.Tensor, Q: torch.Tensor", files)
    restart = at("RESTART_BEFORE_STEP = 2")
    assert "only constant lines" in one(restart, restart, "RESTART_BEFORE_STEP = 2", files, "fixed_restart")
    coeffs = at("POLAR_EXPRESS_COEFFS: tuple")
    assert "only constant lines" in one(coeffs, coeffs + 6, "(8.156554524902461, -22.48329292557795", files)


def test_a_quote_outside_the_cited_range_fails(files):
    commit = at("X = _gemm(Q, X")
    imports = at("import functools")
    msg = one(imports, imports + 2, "X = _gemm(Q, X", files, "fixed_restart")
    assert "is not inside the cited lines" in msg and f"it is at line {commit}" in msg
    # a paraphrase is nowhere
    assert "not inside the cited lines" in one(commit, commit, "X = Q @ X  # commit", files, "fixed_restart")


def test_a_comment_inside_the_range_is_not_key_code(files):
    comment = at("# P = a I + b A + c A^2")
    start = comment - 1 if files["solution.py"].kind(comment - 1) == "code" else comment - 2
    msg = one(start, comment + 1, "P = a I + b A + c A^2", files)
    assert "is not inside the cited lines" in msg


def test_code_that_run_never_reaches_is_not_evidence(files):
    src = expert_path().read_text().split("\n")
    flops = at("def expert_flops(")
    body = next(k for k in range(flops + 1, flops + 30) if src[k - 1].strip().startswith(("m, n", "m =", "return")))
    msg = one(body, body, src[body - 1].strip(), files, "symmetric_triangle")
    assert "never reaches" in msg


def test_a_dead_helper_beside_a_naive_path_proves_nothing():
    """A candidate that runs the step-wise rectangular recurrence but carries an unused Gram-side
    helper: citing the helper for q_composition fails, citing the live loop passes (as
    evidence of what it does)."""
    src = '''import torch


def _gram_compose(X, coeffs):
    R = X @ X.mT
    Q = None
    for a, b, c in coeffs:
        P = a * torch.eye(R.shape[-1]) + b * R + c * (R @ R)
        Q = P if Q is None else P @ Q
        R = P @ R @ P
    return Q @ X


def run(G, steps=5):
    X = G / (G.norm() * 1.02 + 1e-6)
    for a, b, c in COEFFS:
        A = X @ X.mT
        X = a * X + (b * A + c * (A @ A)) @ X
    return X


COEFFS = ((3.4, -4.7, 2.0),) * 5
'''
    f = {"solution.py": SourceFile("solution.py", src)}
    lines = src.split("\n")
    dead = lines.index("        Q = P if Q is None else P @ Q") + 1
    live = lines.index("        X = a * X + (b * A + c * (A @ A)) @ X") + 1
    assert "never reaches" in one(dead, dead, "Q = P if Q is None else P @ Q", f)
    assert one(live, live, "X = a * X + (b * A + c * (A @ A)) @ X", f) is None


def test_genuine_expert_citations_pass_with_their_key_code(files):
    lines = expert_property_lines()
    for lvl, props in PROPERTIES.items():
        ev = [cite(a, b, p) for p in props for a, b in lines[p]]
        assert all(e["code"] for e in ev)
        lv = ImplLevel.model_validate(level(ev, props, [], 80))
        check = verify_impl_level(lvl, lv, props, files)
        assert check.ok, check.errors


def test_a_quote_of_a_multiline_statement_matches_across_lines(files):
    a, b = expert_property_lines()["fixed_restart"][1]  # X = _gemm(Q, X, ...) over several lines
    src = expert_path().read_text().split("\n")
    joined = " ".join(part.strip() for part in src[a - 1:b])
    assert one(a, b, joined, files, "fixed_restart") is None


# ---- end to end: the verdict of the reported case scores 0 on L1 ----------------------------------

def test_import_citations_score_zero_through_the_judge(tmp_path):
    imports = [at("import functools"), at("import os"), at("import torch"), at("import triton")]
    bad = expert_verdict()
    bad["L1"] = level([cite(imports[0], imports[0], "q_composition", code="import functools"),
                       cite(imports[1], imports[1], "q_composition", code="import os"),
                       cite(imports[2], imports[2], "fixed_restart", code="import torch"),
                       cite(imports[3], imports[3], "fixed_restart", code="import triton")],
                      PROPERTIES["L1"], [], 90, "Composes Q and restarts once.")
    store = Store(tmp_path / "j.sqlite")
    subject = impl_from_solution("muon_newton_schulz", "expert", check="trust")
    with FakeProvider({"steps": [{"json": verdict(bad["L1"], bad["L2"], bad["L3"])}]}) as fp:
        cfg = JudgeConfig(backend="openai", model="fake-judge", base_url=fp.base_url + "/v1", repair=False)
        rec = judge(subject, cfg, store=store)
    store.close()
    assert (rec.levels["L1"].raw_score, rec.levels["L1"].score, rec.levels["L1"].verified) == (90, 0.0, False)
    assert rec.levels["L2"].score == 85 and rec.levels["L3"].score == 80  # genuine evidence still counts
    assert rec.js == pytest.approx((0 + 85 + 80) / 3)


def test_statements_that_only_move_a_value_are_not_evidence():
    """``return out`` and ``y = x`` are executable, reachable and long enough to quote, and show
    nothing about how the result was computed; the line that computes it is evidence."""
    src = '''import torch


def run(G, steps=5):
    X = G / (G.norm() + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        X = 1.5 * X - 0.5 * A @ X
    result = X
    return result
'''
    f = {"solution.py": SourceFile("solution.py", src)}
    lines = src.split("\n")
    alias, ret = lines.index("    result = X") + 1, lines.index("    return result") + 1
    step = lines.index("        X = 1.5 * X - 0.5 * A @ X") + 1
    assert line_roles(src)[alias - 1] == NOOP and line_roles(src)[ret - 1] == NOOP
    assert "only no-op lines" in one(ret, ret, "return result", f)
    assert "only no-op lines" in one(alias, ret, "result = X return result", f)
    assert one(step, step, "X = 1.5 * X - 0.5 * A @ X", f) is None
    assert line_roles("def run(x):\n    return x.to(torch.float16)\n")[1] == WORK  # a call is work


# ---- every expert of the suite: the machine check on real files --------------------------------------

def _suite_experts():
    from d2kbench.tasks import list_tasks, load_task

    return [(t, load_task(t).solutions()["expert"]) for t in list_tasks() if "expert" in load_task(t).solutions()]


@pytest.mark.parametrize("task, path", _suite_experts(), ids=lambda x: x if isinstance(x, str) else "")
def test_every_experts_imports_and_decorators_fail_and_its_launches_and_stores_pass(task, path):
    """On each task's expert: the module's imports, its kernels' ``@triton.jit`` decorators and
    signatures, and its literal constants, cited with their own text, fail; every kernel launch
    (``kernel[grid](...)``) and every statement that stores a result (``tl.store``) or does a
    ``tl.dot`` passes: the genuine evidence of a Triton design."""
    import ast

    src = path.read_text()
    f = {"solution.py": SourceFile("solution.py", src)}
    tree = ast.parse(src)

    def check(node, code=None):
        code = code or ast.get_source_segment(src, node).split("\n")[0].split("  #")[0].strip()
        return check_citation(CodeCitation(file="solution.py", start_line=node.lineno, end_line=node.end_lineno,
                                           code=code, supports="x"), f)

    declarative = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    kernels = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
               and any("jit" in ast.unparse(d) for d in n.decorator_list)]
    declarative += [d for k in kernels for d in k.decorator_list]
    constants = [n for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                 and len(ast.unparse(n).replace(" ", "")) >= MIN_CODE_CHARS]
    assert kernels, f"{task}: no Triton kernel found in the expert"
    for node in declarative + constants:
        why = check(node)
        assert why is not None and "only" in why, (task, ast.unparse(node)[:60], why)
    for k in kernels:  # the signature line alone
        why = check_citation(CodeCitation(file="solution.py", start_line=k.lineno, end_line=k.lineno,
                                          code=f"def {k.name}(", supports="x"), f)
        assert why is not None and "only signature lines" in why, (task, k.name, why)
    work = [n for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
            and isinstance(n.value.func, ast.Subscript)]
    work += [n for n in ast.walk(tree) if isinstance(n, (ast.Expr, ast.Assign, ast.AugAssign))
             and ("tl.store(" in ast.unparse(n) or "tl.dot(" in ast.unparse(n))]
    assert work, f"{task}: no kernel launch or tl.store found"
    for node in work:
        assert check(node) is None, (task, ast.unparse(node)[:80], check(node))
