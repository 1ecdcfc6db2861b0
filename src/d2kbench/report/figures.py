"""Report figures as PNG files (matplotlib's object API: no pyplot, no global backend state)."""

from __future__ import annotations

from pathlib import Path

from d2kbench.scoring.trajectory import Trajectory

# Imports inside functions: matplotlib (the report extra) loads when a figure is drawn.

_DPI = 120


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=_DPI, bbox_inches="tight")
    return path


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _footnote(fig, note: str | None) -> None:
    """Write ``note`` under the axes (a figure that leaves the report keeps it)."""
    if note:
        fig.supxlabel(note, fontsize="x-small", wrap=True, ha="left", x=0.0)


def ablation_figure(scores: dict[str, dict[str, float | None]], levels: list[str], path: Path,
                    note: str | None = None) -> Path:
    """Figure 3: grouped bars of S_perf per model (groups) and cumulative guidance level (bars).

    Args:
        scores: model -> level -> S_perf (None: no runs at that level, no bar).
        levels: the levels in order.
        path: the PNG to write.
        note: a footnote (how many declared tasks counted as failed for lack of a result).
    """
    fig = _figure(max(6.0, 1.2 * len(scores) + 2), 3.6)
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(levels))
    for i, lv in enumerate(levels):
        xs = [j + (i - (len(levels) - 1) / 2) * width for j in range(len(scores))]
        ys = [scores[m].get(lv) for m in scores]
        ax.bar([x for x, y in zip(xs, ys) if y is not None], [y for y in ys if y is not None], width, label=lv)
    ax.set_xticks(range(len(scores)), list(scores), rotation=20, ha="right")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_ylabel("S_perf")
    ax.set_title("Cumulative guidance ablation")
    ax.legend(title="guidance", fontsize="small")
    _footnote(fig, note)
    return _save(fig, path)


def trajectory_figure(series: dict[tuple[str, str], Trajectory], overall: dict[str, Trajectory], path: Path,
                      note: str | None = None) -> Path:
    """Figure 4: S'_perf over turns (log scale); one colour per guidance setting, a thin line per
    model and a thick line across models; ``note``: a footnote (see :func:`ablation_figure`)."""
    fig = _figure(7.0, 4.0)
    ax = fig.add_subplot()
    colour = {lv: f"C{i}" for i, lv in enumerate(overall)}
    for (_, lv), tr in series.items():
        ax.step(tr.turns, tr.values, where="post", lw=0.8, alpha=0.45, color=colour.get(lv, "grey"))
    for lv, tr in overall.items():
        ax.step(tr.turns, tr.values, where="post", lw=2.5, color=colour[lv], label=f"{lv} (all models)")
    ax.set_xlabel("agent turn")
    ax.set_ylabel("S'_perf")
    ax.set_yscale("log")
    ax.set_title("Trajectory score over turns (thin lines: single models)")
    ax.legend(title="guidance", fontsize="small")
    _footnote(fig, note)
    return _save(fig, path)


def latency_figure(task: str, workloads: list[str], series: dict[str, dict[str, float]],
                   bounds: dict[str, tuple[float, float]], path: Path) -> Path:
    """A task page's figure: per workload, bars of latency (ms, log scale) per solution, with the
    reference-derived SOL bound and the SOL floor drawn across each group.

    Args:
        series: label -> workload -> latency ms (missing workloads: no bar; no latencies: left out).
        bounds: workload -> (reference-derived SOL ms, floor SOL ms); empty: no SOL lines.
    """
    from matplotlib import colormaps as cm  # tab20: distinct colours for up to 20 series

    fig = _figure(max(7.0, 2.2 * len(workloads) + 3), 4.0)
    ax = fig.add_subplot()
    series = {label: lat for label, lat in series.items() if lat}
    width = 0.8 / max(1, len(series))
    colours = [cm["tab20"](i % 20) for i in range(len(series))]
    for i, (label, lat) in enumerate(series.items()):
        xs = [j + (i - (len(series) - 1) / 2) * width for j, w in enumerate(workloads) if w in lat]
        ax.bar(xs, [lat[w] for w in workloads if w in lat], width, label=label, color=colours[i])
    drawn = [(j, w) for j, w in enumerate(workloads) if w in bounds]
    for k, (j, w) in enumerate(drawn):
        ref, floor = bounds[w]
        ax.hlines(ref, j - 0.45, j + 0.45, colors="black", linestyles="--",
                  label="SOL, reference work (datasheet)" if k == 0 else None)
        ax.hlines(floor, j - 0.45, j + 0.45, colors="red", linestyles=":",
                  label="SOL floor, least work (datasheet)" if k == 0 else None)
    ax.set_xticks(range(len(workloads)), workloads, rotation=15, ha="right", fontsize="small")
    ax.set_yscale("log")
    ax.set_ylabel("latency, ms (per-call mean)")
    ax.set_title(task)
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)
