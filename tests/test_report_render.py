"""Rendering: numbers are formatted only at print time, CSV keeps raw values, HTML embeds figures."""

from __future__ import annotations

import pytest

from d2kbench.report.document import Column, Page, Section, Table
from d2kbench.report.figures import ablation_figure
from d2kbench.report.render import cell_text, html_page, page_markdown, table_csv, table_markdown

T = Table(key="k", title="T", columns=[Column(name="name"), Column(name="score", fmt=".3f"),
                                       Column(name="share", fmt=".1%")],
          rows=[["a|b", 1 / 3, 0.5], ["c", None, 1.0]], notes=["a note"])


def test_markdown_formats_escapes_and_aligns():
    md = table_markdown(T)
    assert md.splitlines()[2:6] == ["| name | score | share |", "|---|---:|---:|", "| a\\|b | 0.333 | 50.0% |",
                                    "| c | - | 100.0% |"]
    assert md.endswith("- a note")
    empty = table_markdown(Table(key="e", title="E", columns=[Column(name="x"), Column(name="y")]))
    assert "| (none) |  |" in empty


def test_csv_keeps_full_precision():
    lines = table_csv(T).splitlines()
    assert lines[0] == "name,score,share"
    assert lines[1] == f'a|b,{1 / 3!r},0.5' and float(lines[1].split(",")[1]) == 1 / 3
    assert lines[2] == "c,,1.0"


def test_cell_text():
    assert cell_text(2, Column(name="n", fmt="d")) == "2"
    assert cell_text(12345, Column(name="n", fmt=",")) == "12,345"
    assert cell_text("x", Column(name="n", fmt=".3f")) == "x"
    assert cell_text(None, Column(name="n")) == "-"


def test_html_embeds_figures_and_links_pages(tmp_path):
    fig = ablation_figure({"m1": {"none": 1.0, "L1": 2.0}, "m2": {"none": 0.5, "L1": None}}, ["none", "L1"],
                          tmp_path / "figures" / "f.png")
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and fig.stat().st_size > 5000
    main = Page(slug="report", title="R <main>", sections=[Section(title="S", tables=[T], figure="figures/f.png",
                                                                   text=["see [the task](tasks/t.md)"])])
    sub = Page(slug="t", title="Task t", sections=[Section(title="F", figure="figures/f.png")])
    pages = [("report.md", page_markdown(main, "report.md")), ("tasks/t.md", page_markdown(sub, "tasks/t.md"))]
    assert "](../figures/f.png)" in pages[1][1]  # relative to the task page's folder
    html = html_page(pages, tmp_path, "title & more")
    assert html.count('src="data:image/png;base64,') == 2
    assert 'href="#page-tasks-t"' in html and 'id="page-tasks-t"' in html
    assert "<title>title &amp; more</title>" in html and "R &lt;main&gt;" in html  # raw HTML is escaped
    assert "<td>a|b</td>" in html
    with pytest.raises(FileNotFoundError):
        html_page([("report.md", "![x](figures/missing.png)")], tmp_path, "t")
