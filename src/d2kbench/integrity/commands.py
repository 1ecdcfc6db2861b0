"""``d2k evil`` (run the evil-solution suite) and ``d2k lint`` (the static rules and the Triton
portability lint on a file)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from d2kbench.terminal import print_error

# Imports inside functions: `d2k --help` and each command load only what that command needs (torch, the
# harness, provider SDKs): start-up time.

console = Console()


#: The integrity commands: a typer app whose commands :mod:`d2kbench.cli` adds to ``d2k``.
app = typer.Typer()


@app.command()
def evil(
    device: str = typer.Option("auto", help="auto, cpu or cuda (cuda also runs the GPU-only cheats)"),
    only: Optional[list[str]] = typer.Option(None, "--only", "-k", help="run cases whose task/name contains this"),
    root: Optional[Path] = typer.Option(None, help="the evil folder (default: <repo>/evil or $D2K_EVIL_DIR)"),
    jobs: int = typer.Option(2, min=1, help="evaluations at a time"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="write the outcomes as JSON"),
    markdown: Optional[Path] = typer.Option(None, "--markdown", help="write a markdown table"),
) -> None:
    """Run every known cheat through the harness; each must be rejected with the expected
    status and rule. Exit code 1 when any is not."""
    from d2kbench.harness import evil as E
    from d2kbench.harness.evaluate import resolve_device

    try:
        dev = resolve_device(device)
    except ValueError as e:
        print_error(console, e)
        raise typer.Exit(2) from None
    cases = E.discover(root, dev)
    if only:
        cases = [c for c in cases if any(k in f"{c.task}/{c.name}" for k in only)]
    console.print(f"running {len(cases)} evil solutions on {dev} ({jobs} at a time)")
    outcomes = E.run_suite(cases, dev, jobs, root, progress=lambda m: console.print(f"  {m}", highlight=False))
    table = Table(*E.COLUMNS, title=f"evil suite on {dev}", show_lines=False)
    for r in E.rows(outcomes):
        style = "green" if r["verdict"] == "pass" else "red"
        table.add_row(*[f"[{style}]{r[c]}[/{style}]" if c == "verdict" else r[c] for c in E.COLUMNS])
    console.print(table)
    n_ok = sum(o.passed for o in outcomes)
    console.print(f"{n_ok}/{len(outcomes)} rejected as expected; "
                  f"wall {sum(o.wall_s for o in outcomes):.0f} s of evaluations")
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(E.to_json(outcomes))
    if markdown:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(E.to_markdown(outcomes, dev))
    if n_ok != len(outcomes):
        raise typer.Exit(1)

@app.command()
def lint(files: list[Path] = typer.Argument(..., help="solution files"),
         triton_check: bool = typer.Option(True, "--triton/--no-triton",
                                           help="also the Triton portability lint (imports each file in a child "
                                                "process under TRITON_INTERPRET=1)")) -> None:
    """Review solution files with the static integrity rules and the Triton portability lint
    (globals and builtins in @triton.jit code that the CPU interpreter accepts but the GPU
    compiler rejects). Every file is reviewed; one that cannot be read or is not valid
    Python gets that as its finding (unreadable, syntax_error). Exit 1 if any file has a
    finding."""
    from d2kbench.integrity.static import static_violations

    unreviewable: dict[Path, tuple[str, str]] = {}
    for f in files:
        try:
            compile(f.read_text(), str(f), "exec")
        except OSError as e:
            unreviewable[f] = ("unreadable", f"{f}: {e.strerror or e}")
        except SyntaxError as e:
            unreviewable[f] = ("syntax_error", f"{f}:{e.lineno}: {type(e).__name__}: {e.msg}")
        except ValueError as e:  # null bytes, undecodable text
            unreviewable[f] = ("syntax_error", f"{f}: {type(e).__name__}: {e}")
    readable = [f for f in files if f not in unreviewable]
    portability = {}
    if triton_check and readable:
        from d2kbench.integrity.triton_lint import check_files

        portability = check_files(readable)
    bad = 0
    for f in files:
        if f in unreviewable:
            found = [unreviewable[f]]
            lint = []
        else:
            found = [(v.rule, v.evidence) for v in static_violations(f)]
            lint = portability.get(str(f.resolve()), [])
            found += [(t.rule, str(t)) for t in lint if t.rule != "triton_lint_error"]
        bad += bool(found)
        console.print(f"[{'red' if found else 'green'}]{'FAIL' if found else 'ok'}[/] {f}")
        for rule, evidence in found:
            console.print(f"  {rule}: {evidence}", markup=False, highlight=False)
        for t in lint:  # the file could not be checked here (e.g. it needs a GPU to import): not a finding
            if t.rule == "triton_lint_error":
                console.print(f"  note: Triton lint skipped: {t.what}", markup=False, highlight=False)
    if bad:
        raise typer.Exit(1)
