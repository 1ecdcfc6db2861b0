"""``d2k judge impl``, ``d2k judge design`` and ``d2k design``: the LLM judge and independent
design runs (registered on the ``d2k`` app by :func:`register`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NoReturn, Optional

import typer
from rich.console import Console
from rich.table import Table

from d2kbench.agents.commands import parse_options
from d2kbench.terminal import print_error

# Imports inside functions: `d2k --help` and each command load only what that command needs (torch, the
# harness, provider SDKs): start-up time.

console = Console()


_options = parse_options  # ``KEY=VALUE`` backend options, shared with `d2k run`


def _fail(message: str, code: int = 2) -> NoReturn:
    print_error(console, message)
    raise typer.Exit(code)


def _store(path: Optional[Path], must_exist: bool = False):
    from d2kbench.store import DEFAULT_PATH, Store

    p = Path(path or DEFAULT_PATH)
    if must_exist and not p.exists():
        _fail(f"no results store at {p} (pass --store or set $D2K_STORE)")
    return Store(p)


def _print_summary(summary, title: str) -> None:
    from d2kbench.judge.verdict import LEVELS

    for rec in summary.records:
        head = f"{title}  sample {rec.sample}: {rec.status}" + ("  (cached)" if rec.cached else "")
        if rec.verdict_id:
            head += f"  verdict {rec.verdict_id}"
        t = Table("level", "judge", "verified", "score", "realised", "missing", "problems", title=head)
        for lvl in LEVELS:
            lv = rec.levels[lvl]
            ok = "[green]yes[/green]" if lv.verified else "[red]no[/red]"
            if lv.repaired:
                ok += " (repaired)"
            t.add_row(lvl, f"{lv.raw_score:g}", ok, f"{lv.score:g}", ", ".join(lv.realised) or "-",
                      ", ".join(lv.missing) or "-", "\n".join(lv.errors) or "-")
        t.add_row("JS", "", "", f"{rec.js:.1f}", "", "", "")
        console.print(t)
        if len(rec.attempts) > 1:
            console.print("  repair round; the first answer had: " + "; ".join(rec.attempts[0].problems),
                          highlight=False, markup=False)
        if rec.status != "judged":
            console.print(f"  {rec.reason}", highlight=False)
        elif rec.summary:
            console.print(f"  {rec.summary}", highlight=False, markup=False)
        judge = rec.judge
        console.print(f"  judge {judge['backend']}:{judge['model']}, prompts {judge['prompt_version']}, rubric "
                      f"{judge['rubric_version']}, verifier {judge['verifier_version']}, inputs {rec.input_hash[:16]}"
                      + (f", cost ${rec.cost_usd:.4f}" if rec.cost_usd is not None else ""), highlight=False)
    if len(summary.records) > 1:
        t = Table("", "median", "low", "high", "spread", title=f"{len(summary.records)} samples")
        for k, s in summary.stats.items():
            t.add_row(k, f"{s.median:.1f}", f"{s.low:.1f}", f"{s.high:.1f}", f"{s.spread:.1f}")
        console.print(t)


def _run_judge(subject, backend: str, model: str, base_url, option, samples: int, repair: bool, max_tokens: int,
               store, json_path: Optional[Path], title: str) -> None:
    from pydantic import ValidationError

    from d2kbench.judge.runner import JudgeConfig, JudgeError, judge_samples
    from d2kbench.judge.targets import TargetError

    try:
        cfg = JudgeConfig(backend=backend, model=model, base_url=base_url, options=_options(option),
                          max_tokens=max_tokens, repair=repair)
    except ValidationError as e:
        _fail("; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()))
    try:
        summary = judge_samples(subject, cfg, samples, store=store,
                                progress=lambda m: console.print(f"[dim]{m}[/dim]", highlight=False))
    except (TargetError, ValueError) as e:
        _fail(str(e))
    except JudgeError as e:
        _fail(str(e), 1)
    _print_summary(summary, title)
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(summary.model_dump_json(indent=1))


#: ``d2k design``: a typer app whose commands :mod:`d2kbench.cli` adds to ``d2k``.
app = typer.Typer()
#: ``d2k judge impl|design``: the ``judge`` group, added to ``d2k`` by :mod:`d2kbench.cli`.
judge_app = typer.Typer(no_args_is_help=True, add_completion=False,
                        help="LLM judge: score code or designs per level (L1/L2/L3) with verified evidence.")

common_backend = typer.Option(..., "--backend", "-b", envvar="D2K_JUDGE_BACKEND",
                              help="openai, anthropic, claude-code or codex")
common_model = typer.Option(..., "--model", "-m", envvar="D2K_JUDGE_MODEL", help="the judge's model id")
common_base_url = typer.Option(None, "--base-url", help="API base URL of the judge")
common_option = typer.Option(None, "--option", "-o", help="backend option KEY=VALUE")
common_samples = typer.Option(1, "--samples", "-n", min=1, max=15,
                              help="independent verdicts; reports the median and spread")
common_repair = typer.Option(True, "--repair/--no-repair", help="one repair round for failed evidence")

@judge_app.command("impl")
def judge_impl(
    target: str = typer.Argument(..., help="a run id (or unique prefix) from the store, or with --task a "
                                           "solution name (expert, straightforward) or a file path"),
    task: Optional[str] = typer.Option(None, "--task", "-t", help="the task of a solution name or path"),
    backend: str = common_backend,
    model: str = common_model,
    base_url: Optional[str] = common_base_url,
    option: Optional[list[str]] = common_option,
    samples: int = common_samples,
    repair: bool = common_repair,
    check: str = typer.Option("auto", "--check", help="how a solution's correctness is decided: auto, store, "
                                                      "evaluate or trust"),
    device: str = typer.Option("auto", "--device", help="for --check evaluate: auto, cuda or cpu"),
    max_tokens: int = typer.Option(16000, "--max-tokens", help="most output tokens per judge answer"),
    store_path: Optional[Path] = typer.Option(None, "--store", help="SQLite store (default ./d2k.sqlite)"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="write the verdicts and statistics as JSON"),
) -> None:
    """Judge the code of a run's final candidate, or of a solution file, per level (0-100)."""
    from d2kbench.judge.targets import TargetError, impl_from_run, impl_from_solution
    from d2kbench.tasks import TaskFileError, load_task

    try:
        if task:
            t = load_task(task)
            if target in t.solutions() or Path(target).is_file():
                store = _store(store_path)
                subject = impl_from_solution(t, target, store, check=check, device=device,
                                             progress=lambda m: console.print(f"[dim]{m}[/dim]"))
            else:
                store = _store(store_path, must_exist=True)
                subject = impl_from_run(store, target)
        else:
            if Path(target).is_file():
                _fail(f"{target} is a file: pass --task TASK to judge it as a solution of that task")
            store = _store(store_path, must_exist=True)
            subject = impl_from_run(store, target)
    except (TargetError, TaskFileError) as e:
        _fail(str(e))
    console.print(f"judging [bold]{subject.target}[/bold] ({subject.task.id}): {subject.reason}", highlight=False)
    _run_judge(subject, backend, model, base_url, option, samples, repair, max_tokens, store, json_path,
               f"{subject.task.id}: implementation")

@judge_app.command("design")
def judge_design(
    target: str = typer.Argument(..., help="a model_design.json file, or a design run id (or prefix)"),
    task: Optional[str] = typer.Option(None, "--task", "-t", help="the task (default: the design's 'task')"),
    backend: str = common_backend,
    model: str = common_model,
    base_url: Optional[str] = common_base_url,
    option: Optional[list[str]] = common_option,
    samples: int = common_samples,
    repair: bool = common_repair,
    max_tokens: int = typer.Option(16000, "--max-tokens", help="most output tokens per judge answer"),
    store_path: Optional[Path] = typer.Option(None, "--store", help="SQLite store (default ./d2k.sqlite)"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="write the verdicts and statistics as JSON"),
) -> None:
    """Judge an independently proposed design (model_design.json) per level (0-100)."""
    from d2kbench.judge.targets import TargetError, design_from_file, design_from_run

    try:
        if Path(target).is_file():
            task_id = task
            if task_id is None:
                try:
                    task_id = json.loads(Path(target).read_text()).get("task")
                except (json.JSONDecodeError, AttributeError):
                    task_id = None
                if not isinstance(task_id, str):
                    _fail(f"{target}: no 'task' field to take the task from; pass --task TASK")
            store = _store(store_path)
            subject = design_from_file(task_id, target)
        else:
            store = _store(store_path, must_exist=True)
            subject = design_from_run(store, target)
    except TargetError as e:
        _fail(str(e))
    console.print(f"judging design [bold]{subject.target}[/bold] ({subject.task.id}): {subject.reason}",
                  highlight=False)
    _run_judge(subject, backend, model, base_url, option, samples, repair, max_tokens, store, json_path,
               f"{subject.task.id}: design")

@app.command("design")
def design_cmd(
    task: str = typer.Argument(..., help="task id"),
    model: str = typer.Option(..., "--model", "-m", help="the provider's model id"),
    backend: str = typer.Option(..., "--backend", "-b", help="openai or anthropic"),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="API base URL (vLLM, SGLang, gateway)"),
    option: Optional[list[str]] = typer.Option(None, "--option", "-o", help="backend option KEY=VALUE"),
    budget_turns: int = typer.Option(20, "--budget-turns", help="most model responses"),
    seed: int = typer.Option(0, help="replicate index"),
    max_tokens: int = typer.Option(16384, "--max-tokens", help="most output tokens per response"),
    store_path: Optional[Path] = typer.Option(None, "--store", help="SQLite store (default ./d2k.sqlite)"),
    runs_root: Path = typer.Option(Path("runs"), "--runs-dir", help="where run directories go"),
) -> None:
    """Independent design run: the agent reads the shared task files and submits model_design.json."""
    from pydantic import ValidationError

    from d2kbench.judge.design_run import DesignRunSpec, run_design
    from d2kbench.store import DEFAULT_PATH
    from d2kbench.tasks import TaskFileError, load_task

    try:
        load_task(task)
        spec = DesignRunSpec(task=task, model=model, backend=backend, base_url=base_url, seed=seed,
                             budget_turns=budget_turns, backend_options=_options(option), max_tokens=max_tokens)
    except TaskFileError as e:
        _fail(str(e))
    except ValidationError as e:
        _fail("; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()))
    out = run_design(spec, store_path=store_path or DEFAULT_PATH, runs_root=runs_root,
                     progress=lambda m: console.print(m, highlight=False, markup=False))
    t = Table("run", "status", "exit", "turns", "submissions", "accepted", "cost $", title=f"design run: {task}")
    t.add_row(out.run_id, out.status, out.exit_reason or "-", str(out.turns), str(out.submissions),
              "yes" if out.accepted else "no", f"{out.cost_usd:.4f}" if out.cost_usd is not None else "unknown")
    console.print(t)
    if out.design_path:
        console.print(f"design: {out.design_path}", highlight=False)
    if out.error:
        print_error(console, out.error.splitlines()[0])
    raise typer.Exit(0 if out.status == "finished" else 1)
